// debug_probe_parse.cpp — a probe fault in words and back (debug_probe.h's table).
#include <array>
#include <sstream>
#include <type_traits>

#include "parallel/runner/debug_probe.h"

namespace sl::parallel {

namespace {

using Kind = ProbeFault::Kind;

// Each kind: its words on the command line, its printed name, and what follows the target.
struct KindWords {
  Kind kind;
  const char* word;
  const char* name;
};
constexpr std::array<KindWords, 10> kKinds = {{
    {Kind::scale_output, "scale-output", "scale_output"},
    {Kind::reuse_output, "reuse-output", "reuse_output"},
    {Kind::scale_gradient, "scale-grad", "scale_gradient"},
    {Kind::scale_contribution, "scale-contribution", "scale_contribution"},
    {Kind::add_bias, "add-bias", "add_bias"},
    {Kind::zigzag_unswapped, "zigzag-unswapped", "zigzag_unswapped"},
    {Kind::ulysses_arrival_order, "ulysses-order", "ulysses_arrival_order"},
    {Kind::ring_chunk_index, "ring-chunk-index", "ring_chunk_index"},
    {Kind::local_capacity, "local-capacity", "local_capacity"},
    {Kind::detached_weights, "detached-weights", "detached_weights"},
}};

const char* kind_name(Kind kind) {
  for (const KindWords& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

bool scales(Kind kind) {
  return kind == Kind::scale_output || kind == Kind::scale_gradient || kind == Kind::scale_contribution;
}

const std::string kUsage =
    "expected 'scale-grad PARAM [DIM=K ...] [step=N] xF', 'scale-output MODULE [...] xF', "
    "'reuse-output MODULE [...] call=A from=B', 'scale-contribution PARAM [...] xF', 'add-bias MODULE [...] [+V]', "
    "'zigzag-unswapped MODULE [...]', 'ulysses-order MODULE [...]', 'ring-chunk-index DIM [step=N]', "
    "'local-capacity MODULE [step=N]' or 'detached-weights MODULE [...]'";

// `text` as a number of the kind `T` (int or double), all of it; an Error naming `what` otherwise.
template <typename T>
T number_of(const std::string& text, const std::string& what, const std::string& fault) {
  size_t used = 0;
  T value{};
  try {
    if constexpr (std::is_same_v<T, int>) value = std::stoi(text, &used);
    else value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw Error("--inject '" + fault + "': " + what + " must be a number, got '" + text + "'");
  return value;
}

MeshDim dim_of(const std::string& key, const std::string& fault) {
  try {
    return mesh_dim_from_name(key);
  } catch (const Error& e) {
    throw Error("--inject '" + fault + "': '" + key + "=' is not step=, call=, from= or a mesh dimension: " + e.what());
  }
}

// "h.N.<what>" for a layer index N.
bool is_layer_module(const std::string& target, const std::string& what) {
  const std::string tail = "." + what;
  if (target.rfind("h.", 0) != 0 || target.size() <= 2 + tail.size() ||
      target.compare(target.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string index = target.substr(2, target.size() - 2 - tail.size());
  return index.find_first_not_of("0123456789") == std::string::npos;
}

// The targets a chapter's place can have: checked here, where the words are.
void check_target(const ProbeFault& f, const std::string& text) {
  const std::string fault = "--inject '" + text + "': ";
  if (f.kind == Kind::add_bias && !is_layer_module(f.target, "attn") && !is_layer_module(f.target, "mlp"))
    throw Error(fault + "add-bias acts in a block's row-parallel c_proj: its module is h.N.attn or h.N.mlp, got '" +
                f.target + "'");
  if ((f.kind == Kind::zigzag_unswapped || f.kind == Kind::ulysses_arrival_order) && !is_layer_module(f.target, "attn"))
    throw Error(fault + kind_name(f.kind) + " acts in a block's attention: its module is h.N.attn, got '" + f.target +
                "'");
  if ((f.kind == Kind::local_capacity || f.kind == Kind::detached_weights) && !is_layer_module(f.target, "mlp"))
    throw Error(fault + kind_name(f.kind) + " acts in a block's expert-parallel mixture of experts: its module is "
                "h.N.mlp, got '" + f.target + "'");
  if (f.kind == Kind::local_capacity && !f.on.empty())
    throw Error(fault + "local-capacity is the plan every rank of the MoE batch computes alike: it takes no DIM=K");
  if (f.kind == Kind::ring_chunk_index) {
    try {
      mesh_dim_from_name(f.target);
    } catch (const Error& e) {
      throw Error(fault + "ring-chunk-index reduces over a mesh dimension's group: " + e.what());
    }
    if (!f.on.empty())
      throw Error(fault + "ring-chunk-index is the ring every rank of the group runs: it takes no DIM=K");
  }
}

void check_complete(const ProbeFault& f, bool factor, bool call, bool from, const std::string& text) {
  if (scales(f.kind) && !factor) throw Error("--inject '" + text + "': no factor (x2, x0, x1.5)");
  if (f.kind != Kind::reuse_output) return;
  if (!(call && from))
    throw Error("--inject '" + text + "': reuse-output needs call=A and from=B (call A returns call B's output)");
  if (!(f.from_call >= 0 && f.from_call < f.at_call))
    throw Error("--inject '" + text + "': from=" + std::to_string(f.from_call) + " must come before call=" +
                std::to_string(f.at_call) + " (a later micro-batch's output does not exist yet)");
}

}  // namespace

bool ProbeFault::acts_at_site() const {
  return kind == Kind::scale_contribution || kind == Kind::add_bias || kind == Kind::zigzag_unswapped ||
         kind == Kind::ulysses_arrival_order || kind == Kind::local_capacity || kind == Kind::detached_weights;
}

std::string ProbeFault::str() const {
  std::ostringstream out;
  out << kind_name(kind) << " " << target;
  if (kind == Kind::reuse_output) out << " (call " << at_call << " returns call " << from_call << "'s output)";
  else if (scales(kind)) out << " x" << factor;
  else if (kind == Kind::add_bias && offset != 0) out << " +" << offset;
  if (!on.empty()) {
    out << " on";
    for (const auto& [dim, coordinate] : on) out << " " << name(dim) << " " << coordinate;
  }
  if (step >= 0) out << " at step " << step;
  return out.str();
}

ProbeFault parse_probe_fault(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.size() < 2) throw Error("--inject '" + text + "': " + kUsage);
  ProbeFault f;
  const KindWords* kind = nullptr;
  for (const KindWords& k : kKinds)
    if (words[0] == k.word) kind = &k;
  if (!kind) throw Error("--inject '" + text + "': unknown fault '" + words[0] + "'; " + kUsage);
  f.kind = kind->kind;
  f.target = words[1];
  bool factor = false, call = false, from = false;
  for (size_t i = 2; i < words.size(); ++i) {
    const std::string& w = words[i];
    const size_t eq = w.find('=');
    if (w[0] == 'x' && eq == std::string::npos && scales(f.kind)) {
      f.factor = number_of<double>(w.substr(1), "the factor after x", text), factor = true;
    } else if (w[0] == '+' && eq == std::string::npos && f.kind == Kind::add_bias) {
      f.offset = number_of<double>(w.substr(1), "the offset after +", text);
    } else if (eq == std::string::npos || eq == 0) {
      throw Error("--inject '" + text + "': cannot read '" + w + "'; " + kUsage);
    } else {
      const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
      if (key == "step") f.step = number_of<int>(value, "step", text);
      else if (key == "call" && f.kind == Kind::reuse_output) f.at_call = number_of<int>(value, "call", text), call = true;
      else if (key == "from" && f.kind == Kind::reuse_output) f.from_call = number_of<int>(value, "from", text), from = true;
      else f.on.emplace_back(dim_of(key, text), number_of<int>(value, key, text));
    }
  }
  check_complete(f, factor, call, from, text);
  check_target(f, text);
  return f;
}

}  // namespace sl::parallel
