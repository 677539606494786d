# mpi_env.sh — sourced by tools/mpi_tests.sh and tools/mpi_train_check.sh: how shardlab runs mpirun
# on one machine, with every byte kept on it.
#
#   mpirun_args   --allow-run-as-root (CI containers run as root), --oversubscribe (more ranks than
#                 cores: 4 ranks on 2), shared memory between ranks (btl self,vader), mpirun's own
#                 control channel on loopback (oob_tcp_if_include lo)
#   isolate       a command prefix that runs mpirun inside a network namespace with only a loopback
#                 interface, where this user may make one (mpirun still listens on every address);
#                 empty otherwise, with a note
#
# Usage:  source tools/mpi_env.sh || exit 2;  "${isolate[@]}" mpirun "${mpirun_args[@]}" -np 2 ...

if ! command -v mpirun > /dev/null; then
  echo "$(basename "$0"): mpirun not found: install OpenMPI (apt-get install openmpi-bin libopenmpi-dev, or make deps)" >&2
  return 2
fi

mpirun_args=(--allow-run-as-root --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo)

isolate=()
if unshare -n sh -c 'ip link set lo up' 2> /dev/null; then
  isolate=(unshare -n sh -c 'ip link set lo up && exec "$@"' sh)
else
  echo "$(basename "$0"): note: cannot make a network namespace (unshare -n failed: no privileges?); mpirun runs" \
    "in this one, its ranks still talk only over shared memory and loopback"
fi
