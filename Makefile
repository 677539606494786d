# shardlab — one Makefile.
#
#   make            the library, lessons, tests, benchmarks and tools, into build/
#   make run        the main job: the GPT learns addition over HSDP 2x2 x cp 2 x tp 2 (configs/hsdp_cp_tp.toml), against serial (TRAIN_ARGS=...)
#   make test       build and run the whole GoogleTest suite;  make test AREA=parallel/zero  one folder of tests/
#   make lessons    every lesson in order;  make lesson N=01  one of them
#   make exercises  the exercises and their status;  make exercise N=01 [SOLUTION=1]  grade one
#   make coursework every grader: templates, SOLUTION=1 and the wrong solutions (CI grades them)
#   make bench      the benchmarks (JSON lines);  make bench-quick  each once, in seconds, checking its output
#   make deps       check for (and, as root, install) Eigen, GoogleTest, nlohmann-json, CLI11, OpenBLAS, OpenMPI
#   make format     clang-format every source;  make compdb  compile_commands.json for editors
#   make fuzz       the libFuzzer targets in fuzz/ (clang), side by side, each for FUZZ_SECONDS (30) from its seeds
#   make clean
#
# Options:
#   SANITIZE=address,undefined | thread   build everything with that sanitizer, into build-<name>/
#   CUDA=auto|0|1                         auto: build the CUDA backend when nvcc is found
#   MPI=auto|0|1                          auto: build the MPI backend when mpicxx is found
#   BLAS=openblas|eigen                   who runs GEMM on the CPU (see README: Results)
#   ARCH=-march=native                    the default; ARCH= builds for any x86-64
#   BUILD=dir                             another build directory
#   AREA="tensor parallel/zero"           the test binary of these folders of tests/ only
#   CCACHE=auto|0                         auto: compile through ccache when it is installed

CXX      ?= g++
SANITIZE ?=
CUDA     ?= auto
BLAS     ?= openblas
comma    := ,
empty    :=
space    := $(empty) $(empty)

# ---- compiler cache -------------------------------------------------------------------------------
# ccache (Debian's `ccache`; make deps installs it) when present: a second build of the same sources
# with the same flags, in this tree or in a fresh clone in another folder, takes the objects from the
# cache. base_dir makes the absolute paths under this tree relative, and the working directory is not
# hashed (hash_dir false), so a clone elsewhere hits the objects of this one; its debug info then
# names the folder the object was first compiled in (the file names in it are relative anyway).
CCACHE ?= auto
ifeq ($(CCACHE),auto)
  CCACHE_BIN := $(shell command -v ccache 2>/dev/null)
else ifneq ($(CCACHE),0)
  CCACHE_BIN := $(CCACHE)
endif
ifneq ($(CCACHE_BIN),)
  LAUNCH := $(CCACHE_BIN)
  export CCACHE_BASEDIR := $(CURDIR)
  export CCACHE_NOHASHDIR := true
endif

ifeq ($(SANITIZE),)
  BUILD ?= build
  OPT   := -O2
  # Line tables: file:line in every backtrace (gdb's bt, a sanitizer's report). DEBUG=-g adds the
  # variables for gdb's `print`, at about 1.4 times the compile time.
  DEBUG ?= -g1
else
  BUILD ?= build-$(subst $(comma),-,$(SANITIZE))
  SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
  # Sanitized builds are for finding bugs, and CI builds two of them on 2 cores, so they are built
  # for compile time: AddressSanitizer at -O0 (a third of -O1's compile time; the tests take 48 s
  # instead of 24), ThreadSanitizer at -O1 (its tests run twice as long at -O0, which costs more
  # than the compile saves). The CUDA backend (nvcc's code is not instrumented anyway) is left out
  # unless CUDA=1 is asked for.
  OPT   := $(if $(filter thread,$(SANITIZE)),-O1,-O0)
  # Line tables are all a sanitizer report needs (file:line in every frame); full debug info (-g)
  # doubled the compile time of some test files.
  DEBUG := -g1
  ifeq ($(origin CUDA),file)
    CUDA := 0
  endif
  # AddressSanitizer + UBSan build with clang++ when it is installed (make deps installs it for them):
  # at -O0 it compiles them in half of g++'s time. ThreadSanitizer stays on g++, faster at -O1.
  ifeq ($(filter thread,$(SANITIZE)),)
    ifeq ($(origin CXX),default)
      CLANGXX := $(shell command -v clang++ 2>/dev/null)
      ifneq ($(CLANGXX),)
        CXX := $(CLANGXX)
      endif
    endif
  endif
  # A sanitized test run leaves out the long cases: the tests whose full name starts with "Long"
  # (a suite, LongMixedPrecisionLearning, or an instantiation, Long/RingVsFull.*): bigger sizes and
  # longer runs of what a shorter case of the same suite already takes through the same code.
  SAN_GTEST_FILTER := --gtest_filter=-Long*
  # ThreadSanitizer also leaves out the suites that repeat, in other number formats or beside a
  # second serial run, the thread patterns the f32 parity suites already take it through: the
  # mixed-precision parity and overflow layouts (the same runners, buckets and collectives on 16-bit
  # buffers) and the divergence finder's layouts and planted faults (launch + Trainer, as
  # NdParallelParity; a reduction fault on a group's worker thread stays in, ProbeReductionFault). They
  # run in `make test`; under TSan they took about 50 of its 190 s.
  ifeq ($(SANITIZE),thread)
    SAN_GTEST_FILTER := --gtest_filter=-Long*:*MixedPrecisionParity*:*MixedPrecisionOverflow*:DivergenceFinder.*:DivergenceFaults.*:*NoFalseAlarm*
  endif
  # ThreadSanitizer sees only instrumented code: OpenBLAS's own threads would be invisible to it,
  # so thread-sanitized builds use Eigen's header-only GEMM (compiled, and so checked, with the rest).
  ifeq ($(SANITIZE),thread)
    ifeq ($(origin BLAS),file)
      BLAS := eigen
    endif
  endif
endif

# -march=native: Eigen and the vectorized loops use every SIMD width this CPU has (ARCH= for a portable build).
# -fvect-cost-model=dynamic: at -O2, GCC otherwise vectorizes only loops that need no runtime alias check.
# -fno-math-errno: sqrt never sets errno (nobody reads it), so loops that call it vectorize too.
ARCH     ?= -march=native
GCC_ONLY := $(if $(findstring clang,$(CXX)),,-fvect-cost-model=dynamic)
CXXFLAGS := -std=c++20 $(OPT) $(GCC_ONLY) -fno-math-errno $(DEBUG) $(ARCH) -Wall -Wextra -MMD -MP -I. -isystem /usr/include/eigen3 $(SANFLAGS)
LDFLAGS  := $(SANFLAGS) -pthread
LDLIBS   :=

ifeq ($(BLAS),openblas)
  OPENBLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-pthread
  CXXFLAGS += -DSL_USE_OPENBLAS -isystem /usr/include/x86_64-linux-gnu/openblas-pthread
  LDLIBS   += -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas
endif

# ---- CUDA switch ---------------------------------------------------------------------------------
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ASKED := $(CUDA)
ifeq ($(CUDA),auto)
  CUDA := $(if $(NVCC),1,0)
endif
ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found (put /usr/local/cuda/bin on PATH, or build with CUDA=0))
  endif
  # nvcc may be a wrapper script (CI has /usr/local/bin/nvcc exec'ing the toolkit's), so ask nvcc
  # itself where its toolkit lives: its dry run prints TOP=<toolkit>/bin/..
  ifeq ($(CUDA_HOME),)
    CUDA_HOME := $(shell $(NVCC) --dryrun -v -x cu -c /dev/null 2>&1 | grep -m1 'TOP=' | sed 's/.*TOP=//; s|/bin/\.\.$$||')
  endif
  ifeq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
    CUDA_HOME := /usr/local/cuda
  endif
  ifeq ($(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so),)
    ifeq ($(CUDA_ASKED),auto)
      $(warning nvcc found but not libcudart.so under $(CUDA_HOME): building without CUDA (set CUDA_HOME))
      CUDA := 0
    else
      $(error CUDA=1 but libcudart.so is not under $(CUDA_HOME)/lib64: set CUDA_HOME to the toolkit)
    endif
  endif
endif
ifeq ($(CUDA),1)
  # Machine code for the A100 (sm_80) and H100/H200 (sm_90), and PTX that newer GPUs compile when they
  # load it, all from one compute_80 PTX (the kernels use nothing newer): nvcc's front end runs once
  # per file instead of twice.
  # --expt-relaxed-constexpr: device code may call constexpr host functions (std::numeric_limits, std::array).
  NVCCFLAGS := -std=c++20 -O2 -I. -gencode arch=compute_80,code=[sm_80,sm_90,compute_80] \
               --expt-relaxed-constexpr -Xcompiler -Wall,-Wextra -MMD -MP
  CXXFLAGS  += -DSL_WITH_CUDA -isystem $(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
  CU_SRCS   := $(wildcard tensor/cuda/*.cu)
endif

# ---- MPI and NCCL (communication backends; see parallel/) ----------------------------------------
# MPI=auto builds the MPI backend when OpenMPI's mpicxx is found (make deps installs it). The library
# is linked into every program, but MPI_Init runs only when a program finds itself under mpirun.
MPI ?= auto
MPICXX := $(shell command -v mpicxx 2>/dev/null)
ifeq ($(MPI),auto)
  MPI := $(if $(MPICXX),1,0)
endif
ifeq ($(MPI),1)
  # OMPI_SKIP_MPICXX: only the C API (the deprecated C++ bindings need libmpi_cxx).
  CXXFLAGS += -DSL_WITH_MPI -DOMPI_SKIP_MPICXX $(patsubst -I%,-isystem %,$(shell mpicxx --showme:compile))
  LDLIBS   += $(filter-out -lmpi_cxx,$(shell mpicxx --showme:link))
endif
# NCCL ships with the CUDA toolkit here; the NCCL backend is built when CUDA is and nccl.h is found.
ifeq ($(CUDA),1)
  ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
    CXXFLAGS += -DSL_WITH_NCCL
    LDLIBS   += -lnccl
  endif
endif

# ---- CLI11 (the command lines of train, plan, checkpoint, the lessons and the benchmarks) ------------
# Header-only, from Debian's libcli11-dev (make deps installs it). Checked once per make, before
# anything compiles, so that a missing header is one clear line instead of an error in every program.
CLI11_HEADER := $(firstword $(wildcard /usr/include/CLI/CLI.hpp /usr/local/include/CLI/CLI.hpp))
.PHONY: cli11
cli11:
	@test -n "$(CLI11_HEADER)" || { echo "CLI11 not found (CLI/CLI.hpp): run make deps, or apt-get install libcli11-dev" >&2; exit 1; }

# ---- what gets built ------------------------------------------------------------------------------
LIB_SRCS    := $(wildcard tensor/*.cpp tensor/cpu/*.cpp tensor/cuda/*.cpp tensor/ops/*.cpp autograd/*.cpp nn/*.cpp parallel/*/*.cpp parallel/*/*/*.cpp)
LIB_OBJS    := $(LIB_SRCS:%.cpp=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
LIB         := $(BUILD)/libshardlab.a
# The layers below the chapters that use them, and the checkpoint files: a test binary whose areas all
# lie here (the ASan build's) links only their objects, libshardlab-core.a, and needs no tool.
# tools/check_includes.sh holds tests/<these> to including nothing above them.
CORE_LAYERS := tensor autograd nn parallel/comm parallel/runner parallel/checkpoint
CORE_LIB    := $(BUILD)/libshardlab-core.a
CORE_OBJS   := $(filter $(addprefix $(BUILD)/,$(addsuffix /%,$(CORE_LAYERS))),$(LIB_OBJS))
LESSONS     := $(patsubst lessons/%.cpp,$(BUILD)/lessons/%,$(sort $(wildcard lessons/*.cpp)))
# tests/ mirrors the tree (tests/tensor, tests/parallel/zero, ...; tests/support holds what they share).
# AREA=...: the test binary of those folders only, built beside the whole suite's, for example
# `make test AREA=parallel/zero`. A sanitized build runs its sanitizer's areas unless AREA is given:
# these two lists are the one place that says which tests each sanitizer runs.
#   ASan + UBSan: the code that handles raw memory and untrusted bytes: the tensor engine and its CPU
#                 kernels, autograd, nn (safetensors), comm's buffers and backends, the checkpoint files.
#   TSan:         every suite whose ranks are threads (each chapter of parallel/), and autograd's
#                 per-thread state. Not the planner's: it runs no chapter of its own, and the layouts
#                 whose ledgers it reads run under TSan in their chapters' suites.
ASAN_AREAS  := tensor autograd nn parallel/comm parallel/checkpoint
TSAN_AREAS  := autograd $(filter-out parallel/planner,$(patsubst tests/%/,%,$(sort $(dir $(wildcard tests/parallel/*/)))))
# A binary of some areas is named after them (build/tests/shardlab_tests-parallel_zero); the whole
# suite's, and a sanitizer's of its own areas, is build*/tests/shardlab_tests.
TEST_BIN    := $(BUILD)/tests/shardlab_tests$(if $(AREA),-$(subst /,_,$(subst $(space),+,$(strip $(AREA)))))
ifneq ($(filter thread,$(SANITIZE)),)
  AREA ?= $(TSAN_AREAS)
else ifneq ($(SANITIZE),)
  AREA ?= $(ASAN_AREAS)
endif
TEST_SRCS   := $(sort $(shell find $(if $(AREA),$(addprefix tests/,$(AREA)),tests) -name 'test_*.cpp' -not -path 'tests/support/*' 2>/dev/null))
ifeq ($(TEST_SRCS),)
  $(error AREA=$(AREA): no tests/<area>/**/test_*.cpp (the areas are the folders of tests/))
endif
TEST_CORE   := $(if $(AREA),$(if $(filter-out $(CORE_LAYERS),$(AREA)),,1))
TEST_LIB    := $(if $(TEST_CORE),$(CORE_LIB),$(LIB))
BENCHES     := $(patsubst bench/%.cpp,$(BUILD)/bench/%,$(wildcard bench/*.cpp))
TOOLS       := $(patsubst tools/%.cpp,$(BUILD)/bin/%,$(wildcard tools/*.cpp))
# Whole archive: every op's object is linked, whichever symbols a program happens to use.
LINK_LIB    := -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive

MAKEFLAGS += --no-builtin-rules
# Parallel by default; a recursive make inherits the jobserver instead of forcing -j again.
ifeq ($(MAKELEVEL),0)
  ifeq ($(filter -j%,$(MAKEFLAGS)),)
    MAKEFLAGS += -j$(shell nproc)
  endif
endif

.PHONY: all run test lessons lesson exercise exercises bench bench-quick deps format compdb clean programs fuzz
# Keep the objects of lessons, benchmarks and tools (make would delete them as intermediate files).
.SECONDARY:
.DEFAULT_GOAL := all

all: deps
	@$(MAKE) --no-print-directory programs

programs: $(LIB) $(LESSONS) $(TEST_BIN) $(BENCHES) $(TOOLS)

# Objects depend on the flags they were built with: change ARCH, BLAS or CUDA and they rebuild.
FLAGS_FILE := $(BUILD)/.flags
$(shell mkdir -p $(BUILD) && echo '$(CXX) $(CXXFLAGS) $(NVCCFLAGS)' | cmp -s - $(FLAGS_FILE) || echo '$(CXX) $(CXXFLAGS) $(NVCCFLAGS)' > $(FLAGS_FILE))

$(BUILD)/%.o: %.cpp $(FLAGS_FILE) | cli11
	@mkdir -p $(dir $@)
	$(LAUNCH) $(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(LAUNCH) $(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(CORE_LIB): $(CORE_OBJS)
	@rm -f $@
	ar rcs $@ $^

# CLI11 is one large header: each family of programs compiles it once, in one object they all link.
LESSON_ARGS := $(BUILD)/lessons/support/lesson_args.o
CLI_OBJ     := $(BUILD)/tools/cli/cli.o

$(BUILD)/lessons/%: $(BUILD)/lessons/%.o $(LESSON_ARGS) $(LIB)
	$(CXX) $(LDFLAGS) $< $(LESSON_ARGS) $(LINK_LIB) $(LDLIBS) -o $@

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(CLI_OBJ) $(LIB)
	$(CXX) $(LDFLAGS) $< $(CLI_OBJ) $(LINK_LIB) $(LDLIBS) -o $@

$(BUILD)/bin/%: $(BUILD)/tools/%.o $(CLI_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(CLI_OBJ) $(LINK_LIB) $(LDLIBS) -o $@

# The tests run the tools too (tests/tools/test_train_cli.cpp), so they are built with the test binary.
$(TEST_BIN): $(TEST_SRCS:%.cpp=$(BUILD)/%.o) $(if $(TEST_CORE),,$(CLI_OBJ)) $(TEST_LIB) | $(if $(TEST_CORE),,$(TOOLS))
	$(CXX) $(LDFLAGS) $(filter %.o,$^) -Wl,--whole-archive $(TEST_LIB) -Wl,--no-whole-archive $(LDLIBS) -lgtest -lgtest_main -o $@

# ---- running things -------------------------------------------------------------------------------
# ASan's shadow-gap protection clashes with the CUDA runtime, which a CUDA build links.
SAN_ENV := ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

test: deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@set -f; $(SAN_ENV) SL_TRAIN_BIN=$(BUILD)/bin/train bash tools/run_tests.sh $(TEST_BIN) $(SAN_GTEST_FILTER) $(GTEST_ARGS)

# The main job, the showcase: the GPT learns addition on 16 thread ranks in the Accelerate guide's
# first layout (dp_replicate 2 x dp_shard 2 x cp 2 x tp 2: HSDP over tensor- and context-parallel
# shards), checked against the serial run (--compare-serial); it fails below 90% held-out accuracy.
# The layout is configs/hsdp_cp_tp.toml (configs/ holds the guide's other layouts: train --config FILE).
# 1000 steps (99-100% held out) keep it near 110 s on 2 cores. `make run TRAIN_ARGS=` trains serially.
TRAIN_ARGS ?= --config configs/hsdp_cp_tp.toml --steps 1000 --compare-serial --min-accuracy 90
run: deps
	@$(MAKE) --no-print-directory $(BUILD)/bin/train
	$(SAN_ENV) $(BUILD)/bin/train $(TRAIN_ARGS)

lessons: deps
	@$(MAKE) --no-print-directory $(LESSONS)
	@set -e; for lesson in $(LESSONS); do echo "=== $$lesson"; $(SAN_ENV) $$lesson; echo; done

lesson: deps
	@test -n "$(N)" || { echo "usage: make lesson N=01"; exit 2; }
	@$(MAKE) --no-print-directory $(filter $(BUILD)/lessons/$(N)_%,$(LESSONS))
	@lesson="$(filter $(BUILD)/lessons/$(N)_%,$(LESSONS))"; \
	  test -n "$$lesson" || { echo "no lesson $(N) (have: $(notdir $(LESSONS)))"; exit 2; }; \
	  $(SAN_ENV) $$lesson

# ---- coursework (exercises/README.md) -------------------------------------------------------------
# A unit is a folder with a grader.cpp: an exercise, exercises/NN_name/ (graded under `timeout 60`), or
# a project, exercises/projects/NN_name/ (`timeout 120`: projects train and simulate more). The
# student's files are its other .cpp files (student.cpp or project.cpp, and any code given with them);
# its wrong solutions are wrong_*.cpp, each standing in for student.cpp (project.cpp). From them:
#   $(BUILD)/exercises/<unit>/grader           the template as shipped (or as the student wrote it)
#   $(BUILD)/exercises-solution/<unit>/grader  grader.cpp with -DSL_SOLUTION: the library's own implementation
#   $(BUILD)/exercises/<unit>/wrong_<what>     a wrong solution, graded by the template's grader
# Every .cpp is compiled once; `make coursework` links them all, so -j builds them side by side.
#   make exercise N=01 [SOLUTION=1 | WRONG=<what>]     make project N=01 [SOLUTION=1 | WRONG=<what>]
#   make exercises / make projects                    each one's difficulty (or chapter) and status
EXERCISES := $(sort $(patsubst exercises/%/grader.cpp,%,$(wildcard exercises/*/grader.cpp)))
PROJECTS  := $(sort $(patsubst exercises/projects/%/grader.cpp,%,$(wildcard exercises/projects/*/grader.cpp)))
CW_UNITS  := $(EXERCISES) $(addprefix projects/,$(PROJECTS))
CW_BUILD  := $(BUILD)/exercises
CW_FLAGS  := -Wno-unused-parameter  # the TODO bodies use no parameter

$(CW_BUILD)/%.o: exercises/%.cpp $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(LAUNCH) $(CXX) $(CXXFLAGS) $(CW_FLAGS) -c $< -o $@

$(CW_BUILD)-solution/%.o: exercises/%.cpp $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(LAUNCH) $(CXX) $(CXXFLAGS) $(CW_FLAGS) -DSL_SOLUTION -c $< -o $@

# The link rules of one unit: $(1) is its folder under exercises/, $(2) its student's files, $(3) the
# file a wrong solution stands in for.
define CW_UNIT
$(CW_BUILD)/$(1)/grader: $(patsubst exercises/%.cpp,$(CW_BUILD)/%.o,$(2)) $(CW_BUILD)/$(1)/grader.o $(LIB)
	$$(CXX) $$(LDFLAGS) $$(filter %.o,$$^) $$(LINK_LIB) $$(LDLIBS) -o $$@
$(CW_BUILD)-solution/$(1)/grader: $(patsubst exercises/%.cpp,$(CW_BUILD)/%.o,$(2)) $(CW_BUILD)-solution/$(1)/grader.o $(LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$(filter %.o,$$^) $$(LINK_LIB) $$(LDLIBS) -o $$@
$(CW_BUILD)/$(1)/wrong_%: $(patsubst exercises/%.cpp,$(CW_BUILD)/%.o,$(filter-out $(3),$(2))) $(CW_BUILD)/$(1)/wrong_%.o $(CW_BUILD)/$(1)/grader.o $(LIB)
	$$(CXX) $$(LDFLAGS) $$(filter %.o,$$^) $$(LINK_LIB) $$(LDLIBS) -o $$@
endef
cw_students = $(filter-out exercises/$(1)/grader.cpp exercises/$(1)/wrong_%.cpp,$(wildcard exercises/$(1)/*.cpp))
cw_answer   = $(firstword $(wildcard exercises/$(1)/student.cpp exercises/$(1)/project.cpp))
$(foreach unit,$(CW_UNITS),$(eval $(call CW_UNIT,$(unit),$(call cw_students,$(unit)),$(call cw_answer,$(unit)))))
CW_WRONG  := $(patsubst exercises/%.cpp,$(CW_BUILD)/%,$(wildcard $(CW_UNITS:%=exercises/%/wrong_*.cpp)))
CW_BINS   := $(CW_UNITS:%=$(CW_BUILD)/%/grader) $(CW_UNITS:%=$(CW_BUILD)-solution/%/grader) $(CW_WRONG)

.PHONY: coursework project projects
coursework: $(CW_BINS)

# grade KIND N: build and run one unit's grader (SOLUTION=1: the library's; WRONG=what: wrong_what.cpp).
cw_grader = $(if $(WRONG),$(CW_BUILD)/$(1)/wrong_$(WRONG),$(if $(SOLUTION),$(CW_BUILD)-solution,$(CW_BUILD))/$(1)/grader)
define CW_GRADE
	@test -n "$(N)" || { echo "usage: make $(1) N=01 [SOLUTION=1 | WRONG=<what>]"; exit 2; }
	@unit="$(filter $(N)_%,$(2))"; \
	  test -n "$$unit" || { echo "no $(1) $(N) (have: $(2))"; exit 2; }; \
	  grader="$(call cw_grader,$(3)$$unit)"; \
	  $(MAKE) --no-print-directory "$$grader" && timeout $(4) "$$grader"
endef

exercise: deps
	$(call CW_GRADE,exercise,$(EXERCISES),,60)

project: deps
	$(call CW_GRADE,project,$(PROJECTS),projects/,120)

exercises:
	@bash exercises/status.sh $(EXERCISES)

projects:
	@printf '%-30s %s\n' project extends; \
	  for pr in $(PROJECTS); do \
	    printf '%-30s %s\n' "$$pr" "$$(sed -n 's/^- \*\*Extends:\*\* *//p' exercises/projects/$$pr/README.md | head -1)"; \
	  done

# Benchmarks run with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset: this machine sets them to a slower
# kernel for old OpenBLAS builds, and ../shared/bench/README.md measures PyTorch without them too.
bench: deps
	@$(MAKE) --no-print-directory $(BENCHES)
	@set -e; for b in $(BENCHES); do env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $$b; done

# Each benchmark once in its --quick mode (seconds, not minutes): it runs its smallest case and checks
# its own output (finite, positive times; bytes equal to their formula), exiting non-zero when a check
# fails, so a benchmark that breaks fails CI. Every benchmark runs even after one fails (a CI log then
# shows all that broke), each with its wall time; the failures are named at the end.
bench-quick: deps
	@$(MAKE) --no-print-directory $(BENCHES)
	@failed=; for b in $(BENCHES); do \
	  echo "=== $$b --quick"; start=$$(date +%s%N); \
	  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $$b --quick || failed="$$failed $${b##*/}"; \
	  ms=$$((($$(date +%s%N) - start) / 1000000)); echo "=== $${b##*/}: $$((ms / 1000)).$$(printf %03d $$((ms % 1000))) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench-quick: FAILED:$$failed"; exit 1; fi

deps:
	@bash tools/deps.sh $(if $(filter address,$(subst $(comma), ,$(SANITIZE))),sanitize)

format:
	clang-format -i $(shell git ls-files '*.cpp' '*.h' '*.cu')

# bear records every compile command, so everything is compiled once more, in a scratch directory
# (build/ is left as it is).
compdb:
	rm -rf build-compdb
	bear --output compile_commands.json -- $(MAKE) programs BUILD=build-compdb
	rm -rf build-compdb

# ---- fuzzing ----------------------------------------------------------------------------------------
# The checkpoint readers against hostile files: fuzz/fuzz_safetensors.cpp (a shard) and
# fuzz/fuzz_metadata.cpp (metadata.json), built with clang's libFuzzer, AddressSanitizer and UBSan from
# only the sources they need (not the library), into build-fuzz/. Each runs FUZZ_SECONDS from its seeds
# (fuzz/corpus/<target>/, copied: what it finds goes to build-fuzz/corpus-<target>/); a crash, a leak,
# undefined behaviour or an exception other than sl::Error fails the target and leaves the input in
# build-fuzz/ (crash-*, leak-*), which the fuzzer then reruns alone.
FUZZ_CXX     ?= clang++
FUZZ_SECONDS ?= 30
FUZZ_BUILD   := build-fuzz
FUZZ_FLAGS   := -std=c++20 -O1 -g -I. -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_TARGETS := safetensors metadata
FUZZ_SRCS    := tensor/dtype.cpp tensor/error.cpp tensor/shape.cpp nn/safetensors_header.cpp parallel/runner/state_pieces.cpp \
                $(addprefix parallel/checkpoint/,file_io.cpp metadata.cpp regions.cpp sha256.cpp shard_reader.cpp)
FUZZ_OBJS    := $(FUZZ_SRCS:%.cpp=$(FUZZ_BUILD)/%.o)

fuzz:
	@bash tools/deps.sh fuzz
	@command -v $(FUZZ_CXX) >/dev/null 2>&1 || { echo "make fuzz: $(FUZZ_CXX) not found; install clang and libFuzzer: apt-get install clang libclang-rt-14-dev"; exit 1; }
	@mkdir -p $(FUZZ_BUILD) && printf 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }\n' > $(FUZZ_BUILD)/probe.cpp
	@$(FUZZ_CXX) -fsanitize=fuzzer $(FUZZ_BUILD)/probe.cpp -o $(FUZZ_BUILD)/probe 2>/dev/null || { echo "make fuzz: $(FUZZ_CXX) cannot link libFuzzer (-fsanitize=fuzzer); install it: apt-get install libclang-rt-14-dev (or the libclang-rt-N-dev of your clang)"; exit 1; }
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
	@for target in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$target; \
	  echo "=== fuzz_$$target: $(FUZZ_SECONDS) s from $$(ls fuzz/corpus/$$target | wc -l) seeds"; \
	  ( ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    $(FUZZ_BUILD)/fuzz_$$target -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
	      -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus-$$target fuzz/corpus/$$target \
	      > $(FUZZ_BUILD)/fuzz_$$target.log 2>&1; echo $$? > $(FUZZ_BUILD)/fuzz_$$target.status ) & \
	done; wait; \
	for target in $(FUZZ_TARGETS); do \
	  status=$$(cat $(FUZZ_BUILD)/fuzz_$$target.status); \
	  echo "=== fuzz_$$target"; \
	  grep -E '^(INFO: seed corpus|#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss|Done|SUMMARY|==[0-9]+==ERROR)' \
	    $(FUZZ_BUILD)/fuzz_$$target.log || true; \
	  test "$$status" -eq 0 || { tail -n 40 $(FUZZ_BUILD)/fuzz_$$target.log; \
	    echo "make fuzz: fuzz_$$target failed (log: $(FUZZ_BUILD)/fuzz_$$target.log; the input: $(FUZZ_BUILD)/crash-* or leak-*)"; exit 1; }; \
	done; echo "make fuzz: no crash, leak or undefined behaviour in $(words $(FUZZ_TARGETS)) targets x $(FUZZ_SECONDS) s (run side by side)"

$(FUZZ_BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(LAUNCH) $(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/fuzz/fuzz_%.o $(FUZZ_OBJS)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $^ -o $@

clean:
	rm -rf build build-*

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
ifneq ($(filter fuzz $(FUZZ_BUILD)/%,$(MAKECMDGOALS)),)
  -include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
endif
