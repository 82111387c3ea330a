// Where this process sits in a distributed job, read from its launcher's environment.
//
//   auto launch = ckpt::LauncherEnv();      // under torchrun --nproc-per-node 4: rank 0..3 of 4
//   if (!launch.ok()) return launch.status();
//   auto outs = plan->Resolve(ckpt->tensors(), launch->rank, launch->world);
//
// The launchers' variables, tried in this order (the first family whose rank and size
// are both set wins, so torchrun inside an srun or mpirun allocation is read as torchrun;
// with none complete, a family of which some variables are set but not its rank and size
// is an error, never a silent rank 0 of 1; Slurm's excepted, whose variables every
// process of an allocation sees):
//   torchrun, torch.distributed.launch, accelerate, DeepSpeed: RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE (DeepSpeed's LOCAL_SIZE when that is absent)
//   Open MPI:            OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MVAPICH2:            MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH / Intel MPI:   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   Slurm srun:          SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the node's task
//                        count from SLURM_TASKS_PER_NODE ("4(x2),3") at SLURM_NODEID, else
//                        SLURM_NTASKS_PER_NODE
// The Python module's ckpt.launcher_env() is this function.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "ckpt/status.h"

namespace ckpt {

// This process's place in its job.
struct Launch {
  int rank = 0;         // global rank, in [0, world)
  int world = 1;        // number of processes in the job
  int local_rank = 0;   // rank among the processes on this node, in [0, local_world)
  int local_world = 1;  // processes of the job on this node
  // Whose variables said so: "torchrun", "open-mpi", "mvapich2", "pmi", "slurm"; "none"
  // when no launcher's were set (rank 0 of 1); "arguments" from ResolveLaunch when the
  // caller's rank/world differ from the launcher's.
  std::string source = "none";
};

// The Launch from the process environment (getenv; not thread-safe against setenv).
// With no launcher variables: {0, 1, 0, 1, "none"}. A local rank the launcher does not
// give is the global rank when the job is one node (local world unknown or = world), else
// 0; an unknown local world is the world when the local rank is the rank, else local
// rank + 1. InvalidArgument naming the variable and its value for: a value that is not a
// decimal integer in int's range, a world or local world below 1, a rank outside
// [0, world), a local rank outside [0, local world), and contradictions (a local world
// above the world, a local rank above the rank, more ranks after this one on its node
// than in the job). A family with only some of its variables set (RANK=1 without
// WORLD_SIZE, LOCAL_RANK alone) is skipped when a later family is complete (a wrapper
// that exports LOCAL_RANK from mpirun's); when none is, InvalidArgument names the
// variables set and those missing and says what to do. Slurm's half-set family (a batch
// script's SLURM_PROCID=0 without SLURM_NTASKS, an salloc shell's SLURM_NTASKS alone) is
// one process: rank 0 of 1.
Result<Launch> LauncherEnv();
// The same, reading variables from `env` instead of the process environment.
Result<Launch> LauncherEnvFrom(const std::map<std::string, std::string>& env);

// `rank` and `world` as given, each one left empty taken from the launcher (`env`, or the
// process environment when null). The local rank and world are the launcher's when
// (rank, world) is the launcher's place, else rank and world themselves with source
// "arguments" (taken as one node). InvalidArgument for a rank outside [0, world) (saying
// which launcher gave the values taken from it) and for LauncherEnv's errors, but for an
// incomplete launcher environment when both rank and world are given.
Result<Launch> ResolveLaunch(std::optional<int> rank, std::optional<int> world,
                             const std::map<std::string, std::string>* env = nullptr);

}  // namespace ckpt
