#include "ckpt/launcher.h"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <vector>

namespace ckpt {
namespace {

// A variable lookup: the value, or nullopt when unset.
using Lookup = std::function<std::optional<std::string>(const std::string&)>;

struct Family {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
  const char* local_world_fallback;  // nullptr: none
  const char* launchers;             // who sets these variables, for an incomplete set
  // Slurm's variables are set in every process of an allocation (a batch script, an
  // salloc shell: SLURM_PROCID=0 without SLURM_NTASKS, or the reverse), not only in the
  // tasks srun starts: an incomplete set there is one process, not a broken launch.
  bool incomplete_is_one_process;
};

constexpr Family kFamilies[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
     "torchrun, torch.distributed.launch, accelerate and deepspeed set RANK, WORLD_SIZE, LOCAL_RANK and "
     "LOCAL_WORLD_SIZE (deepspeed: LOCAL_SIZE) together",
     false},
    {"open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, "Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and "
     "_LOCAL_SIZE together", false},
    {"mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE", nullptr, "MVAPICH2 sets MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE "
     "together", false},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr,
     "MPICH and Intel MPI set PMI_RANK and PMI_SIZE together", false},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", nullptr,
     "srun sets SLURM_PROCID and SLURM_NTASKS together", true},
};

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Parses a whole decimal int (an optional '-', digits).
std::optional<int> ParseInt(const std::string& text) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty()) return std::nullopt;
  return v;
}

// The variable's value as an int; nullopt when unset or empty. `counts`: a Slurm count
// like "4(x2)" reads as 4.
Result<std::optional<int>> GetInt(const Lookup& get, const char* name, bool counts = false) {
  if (name == nullptr) return std::optional<int>();
  std::optional<std::string> raw = get(name);
  if (!raw) return std::optional<int>();
  std::string text = Trim(*raw);
  if (text.empty()) return std::optional<int>();
  if (counts) text = text.substr(0, text.find('('));
  std::optional<int> v = ParseInt(text);
  if (!v) return InvalidArgument("launcher variable " + std::string(name) + "='" + Trim(*raw) + "' is not an integer");
  return v;
}

// This node's entry of SLURM_TASKS_PER_NODE ("2(x3),1": 2 on nodes 0-2, 1 on node 3).
Result<std::optional<int>> SlurmTasksOnNode(const Lookup& get) {
  std::optional<std::string> list = get("SLURM_TASKS_PER_NODE");
  CKPT_ASSIGN_OR_RETURN(std::optional<int> node, GetInt(get, "SLURM_NODEID"));
  if (!list || !node || Trim(*list).empty()) return std::optional<int>();
  const std::string text = Trim(*list);
  const auto bad = [&] {
    return InvalidArgument("launcher variable SLURM_TASKS_PER_NODE='" + text + "' is not a Slurm task list");
  };
  int64_t first = 0;  // the first node of the current entry
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string entry = text.substr(pos, comma - pos);
    int repeat = 1;
    const size_t paren = entry.find("(x");
    if (paren != std::string::npos) {
      if (entry.back() != ')') return bad();
      std::optional<int> r = ParseInt(entry.substr(paren + 2, entry.size() - paren - 3));
      if (!r || *r < 1) return bad();
      repeat = *r;
      entry = entry.substr(0, paren);
    }
    std::optional<int> tasks = ParseInt(entry);
    if (!tasks) return bad();
    if (*node >= first && *node < first + repeat) return std::optional<int>(*tasks);
    first += repeat;
    pos = comma + 1;
  }
  return InvalidArgument("launcher variable SLURM_NODEID=" + std::to_string(*node) +
                         " is past the nodes of SLURM_TASKS_PER_NODE='" + text + "'");
}

std::string Var(const char* name, int value) { return std::string(name) + "=" + std::to_string(value); }

Result<Launch> FromFamily(const Lookup& get, const Family& f, int rank, int world) {
  if (world < 1) return InvalidArgument("launcher variable " + Var(f.world, world) + " must be at least 1");
  if (rank < 0 || rank >= world) {
    return InvalidArgument("launcher variable " + Var(f.rank, rank) + " is outside [0, " + Var(f.world, world) + ")");
  }
  CKPT_ASSIGN_OR_RETURN(std::optional<int> local_rank, GetInt(get, f.local_rank));
  const bool slurm = std::string(f.source) == "slurm";
  std::optional<int> local_world;
  const char* local_world_var = f.local_world;
  if (slurm) {
    CKPT_ASSIGN_OR_RETURN(local_world, SlurmTasksOnNode(get));
    if (local_world) local_world_var = "SLURM_TASKS_PER_NODE";
  }
  if (!local_world) {
    local_world_var = f.local_world;
    CKPT_ASSIGN_OR_RETURN(local_world, GetInt(get, f.local_world, /*counts=*/slurm));
  }
  if (!local_world && f.local_world_fallback != nullptr) {
    local_world_var = f.local_world_fallback;
    CKPT_ASSIGN_OR_RETURN(local_world, GetInt(get, f.local_world_fallback));
  }
  Launch l;
  l.rank = rank;
  l.world = world;
  l.source = f.source;
  l.local_rank = local_rank ? *local_rank : (!local_world || *local_world == world ? rank : 0);
  l.local_world = local_world ? *local_world : (l.local_rank == rank ? world : l.local_rank + 1);
  const std::string lw = local_world ? Var(local_world_var, l.local_world) : "local world " + std::to_string(l.local_world);
  const std::string lr = local_rank ? Var(f.local_rank, l.local_rank) : "local rank " + std::to_string(l.local_rank);
  if (l.local_world < 1) return InvalidArgument("launcher variable " + lw + " must be at least 1");
  if (l.local_rank < 0 || l.local_rank >= l.local_world) {
    return InvalidArgument("launcher variable " + lr + " is outside [0, " + lw + ")");
  }
  // Contradictions: a node cannot hold more of the job than the job, nor more ranks below
  // or above this one than the job has.
  if (l.local_world > world) {
    return InvalidArgument("contradictory launcher variables: " + lw + " is more than " + Var(f.world, world));
  }
  if (l.local_rank > rank) {
    return InvalidArgument("contradictory launcher variables: " + lr + " is more than " + Var(f.rank, rank));
  }
  if (l.local_world - l.local_rank > world - rank) {
    return InvalidArgument("contradictory launcher variables: " + lr + " of " + lw + " leaves more ranks after " +
                           Var(f.rank, rank) + " on this node than " + Var(f.world, world) + " has");
  }
  return l;
}

// For a family whose rank or size is missing while some of its variables are set: the
// error that names those set and those missing, and what to do. "" when none is set.
std::string IncompleteFamily(const Lookup& get, const Family& f) {
  std::vector<std::string> set, missing;
  for (const char* name : {f.rank, f.world, f.local_rank, f.local_world, f.local_world_fallback}) {
    if (name == nullptr) continue;
    std::optional<std::string> raw = get(name);
    const bool present = raw && !Trim(*raw).empty();
    if (present) set.push_back(std::string(name) + "=" + Trim(*raw));
    else if (name == f.rank || name == f.world) missing.push_back(name);
  }
  if (set.empty()) return "";
  const auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
    return out;
  };
  std::vector<std::string> set_names;
  for (const std::string& v : set) set_names.push_back(v.substr(0, v.find('=')));
  return "incomplete launcher environment: " + join(set) + (set.size() == 1 ? " is" : " are") + " set but " +
         join(missing) + (missing.size() == 1 ? " is" : " are") + " not (" + f.launchers +
         "), so this process cannot tell its rank and world: set " + join(missing) + " too, unset " + join(set_names) +
         ", or pass rank and world explicitly";
}

// The first family whose rank and size are both set; with none, rank 0 of 1, unless a
// family other than Slurm's is half set: then InvalidArgument (IncompleteFamily), or,
// with `incomplete_ok`, rank 0 of 1 too.
Result<Launch> FromLookup(const Lookup& get, bool incomplete_ok = false) {
  std::string incomplete;
  for (const Family& f : kFamilies) {
    CKPT_ASSIGN_OR_RETURN(std::optional<int> rank, GetInt(get, f.rank));
    CKPT_ASSIGN_OR_RETURN(std::optional<int> world, GetInt(get, f.world));
    if (rank && world) return FromFamily(get, f, *rank, *world);
    if (incomplete.empty() && !f.incomplete_is_one_process) incomplete = IncompleteFamily(get, f);
  }
  if (!incomplete.empty() && !incomplete_ok) return InvalidArgument(incomplete);
  return Launch{};
}

Lookup EnvLookup(const std::map<std::string, std::string>* env) {
  if (env != nullptr) {
    return [env](const std::string& name) -> std::optional<std::string> {
      auto it = env->find(name);
      if (it == env->end()) return std::nullopt;
      return it->second;
    };
  }
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

}  // namespace

Result<Launch> LauncherEnv() { return FromLookup(EnvLookup(nullptr)); }

Result<Launch> LauncherEnvFrom(const std::map<std::string, std::string>& env) { return FromLookup(EnvLookup(&env)); }

Result<Launch> ResolveLaunch(std::optional<int> rank, std::optional<int> world,
                             const std::map<std::string, std::string>* env) {
  // Both given: an incomplete launcher environment is not needed (malformed values still are errors).
  CKPT_ASSIGN_OR_RETURN(Launch launch, FromLookup(EnvLookup(env), /*incomplete_ok=*/rank && world));
  const int r = rank ? *rank : launch.rank;
  const int w = world ? *world : launch.world;
  if (w < 1 || r < 0 || r >= w) {
    const std::string where = (!rank || !world) ? " (launcher: " + launch.source + ")" : "";
    return InvalidArgument("rank " + std::to_string(r) + " out of range for world " + std::to_string(w) + where);
  }
  if (r == launch.rank && w == launch.world) return launch;
  Launch l;
  l.rank = l.local_rank = r;
  l.world = l.local_world = w;
  l.source = "arguments";
  return l;
}

}  // namespace ckpt
