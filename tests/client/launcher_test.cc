// ckpt::LauncherEnv / LauncherEnvFrom / ResolveLaunch (include/ckpt/launcher.h): every
// launcher family, the defaults for missing local values, and errors naming the variables.
#include "ckpt/launcher.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace ckpt {
namespace {

using Env = std::map<std::string, std::string>;

void ExpectLaunch(const Env& env, int rank, int world, int local_rank, int local_world, const std::string& source) {
  auto l = LauncherEnvFrom(env);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->rank, rank);
  EXPECT_EQ(l->world, world);
  EXPECT_EQ(l->local_rank, local_rank);
  EXPECT_EQ(l->local_world, local_world);
  EXPECT_EQ(l->source, source);
}

void ExpectError(const Env& env, const std::string& needle) {
  auto l = LauncherEnvFrom(env);
  ASSERT_FALSE(l.ok()) << "accepted";
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find(needle), std::string::npos) << l.status().message();
}

TEST(LauncherEnvTest, Families) {
  ExpectLaunch({}, 0, 1, 0, 1, "none");
  ExpectLaunch({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}, 3, 8, 1, 2,
               "torchrun");
  ExpectLaunch({{"RANK", " 3 "}, {"WORLD_SIZE", "4"}}, 3, 4, 3, 4, "torchrun");
  ExpectLaunch({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_SIZE", "4"}}, 5, 8, 1, 4, "torchrun");
  ExpectLaunch({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
               5, 6, 1, 2, "open-mpi");
  ExpectLaunch({{"MV2_COMM_WORLD_RANK", "2"}, {"MV2_COMM_WORLD_SIZE", "4"}, {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}},
               2, 4, 0, 2, "mvapich2");
  ExpectLaunch({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, 1, 2, 1, 2, "pmi");
  ExpectLaunch({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}},
               5, 8, 1, 4, "slurm");
  ExpectLaunch({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
                {"SLURM_TASKS_PER_NODE", "2(x2),1"}},
               4, 5, 0, 1, "slurm");
  // torchrun inside srun: torchrun's variables win; a half-set family is skipped when a
  // later one is complete (a wrapper exporting LOCAL_RANK from mpirun's).
  ExpectLaunch({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}, 1, 2, 1, 2,
               "torchrun");
  ExpectLaunch({{"RANK", "1"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, 1, 2, 1, 2, "pmi");
  ExpectLaunch({{"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
               3, 4, 1, 2, "open-mpi");
  // Empty values are unset.
  ExpectLaunch({{"RANK", ""}, {"WORLD_SIZE", " "}}, 0, 1, 0, 1, "none");
}

// Issue 22: a half-set launcher environment is an error naming what is set and what is
// missing, never rank 0 of 1 (which would have every rank load whole tensors).
TEST(LauncherEnvTest, AnIncompleteLauncherEnvironmentIsAnError) {
  ExpectError({{"RANK", "1"}}, "incomplete launcher environment: RANK=1 is set but WORLD_SIZE is not");
  ExpectError({{"RANK", "1"}}, "set WORLD_SIZE too, unset RANK, or pass rank and world explicitly");
  ExpectError({{"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}}, "WORLD_SIZE=4 and LOCAL_RANK=2 are set but RANK is not");
  ExpectError({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}},
              "LOCAL_RANK=0 and LOCAL_WORLD_SIZE=8 are set but RANK and WORLD_SIZE are not (torchrun");
  ExpectError({{"RANK", "3"}, {"LOCAL_SIZE", "4"}}, "RANK=3 and LOCAL_SIZE=4 are set but WORLD_SIZE is not");  // deepspeed
  ExpectError({{"OMPI_COMM_WORLD_RANK", "2"}},
              "OMPI_COMM_WORLD_RANK=2 is set but OMPI_COMM_WORLD_SIZE is not (Open MPI's mpirun");
  ExpectError({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
              "are set but OMPI_COMM_WORLD_RANK is not");
  ExpectError({{"MV2_COMM_WORLD_RANK", "1"}}, "MV2_COMM_WORLD_RANK=1 is set but MV2_COMM_WORLD_SIZE is not");
  ExpectError({{"PMI_SIZE", "4"}}, "PMI_SIZE=4 is set but PMI_RANK is not");
  // The first half-set family is named, whichever comes after.
  ExpectError({{"RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}}, "RANK=1 is set but WORLD_SIZE is not");
  // Slurm's variables reach every process of an allocation: a batch script (SLURM_PROCID=0,
  // no SLURM_NTASKS) or an salloc shell (SLURM_NTASKS alone) is one process.
  ExpectLaunch({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}}, 0, 1, 0, 1, "none");
  ExpectLaunch({{"SLURM_NTASKS", "8"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}}, 0, 1, 0, 1, "none");
  // But a malformed value is an error wherever it is.
  ExpectError({{"SLURM_PROCID", "zero"}}, "SLURM_PROCID='zero' is not an integer");
  ExpectError({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK=-1 is outside [0, WORLD_SIZE=2)");
  ExpectError({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID=4 is outside [0, SLURM_NTASKS=4)");
  ExpectError({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "-2"}}, "OMPI_COMM_WORLD_SIZE=-2 must be at least 1");
  ExpectError({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}}, "LOCAL_RANK='x' is not an integer");
  // Rank and world given explicitly need no launcher: an incomplete one is no error then.
  const Env half = {{"RANK", "1"}};
  auto given = ResolveLaunch(2, 4, &half);
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->rank, 2);
  EXPECT_EQ(given->source, "arguments");
  auto only_world = ResolveLaunch(std::nullopt, 4, &half);
  ASSERT_FALSE(only_world.ok());
  EXPECT_NE(only_world.status().message().find("RANK=1 is set but WORLD_SIZE is not"), std::string::npos)
      << only_world.status().message();
}

TEST(LauncherEnvTest, ErrorsNameTheVariables) {
  ExpectError({{"RANK", "0"}, {"WORLD_SIZE", "two"}}, "WORLD_SIZE='two' is not an integer");
  ExpectError({{"RANK", "0x1"}, {"WORLD_SIZE", "2"}}, "RANK='0x1' is not an integer");
  ExpectError({{"RANK", "0"}, {"WORLD_SIZE", "4294967297"}}, "WORLD_SIZE='4294967297' is not an integer");
  ExpectError({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be at least 1");
  ExpectError({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is outside [0, WORLD_SIZE=2)");
  ExpectError({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}},
              "LOCAL_RANK=4 is outside [0, LOCAL_WORLD_SIZE=4)");
  ExpectError({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}},
              "contradictory launcher variables: LOCAL_WORLD_SIZE=8 is more than WORLD_SIZE=4");
  ExpectError({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}},
              "contradictory launcher variables: LOCAL_RANK=2 is more than RANK=1");
  ExpectError({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "3"}, {"SLURM_TASKS_PER_NODE", "2"}},
              "SLURM_NODEID=3 is past the nodes of SLURM_TASKS_PER_NODE='2'");
  ExpectError({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x0)"}},
              "SLURM_TASKS_PER_NODE='2(x0)' is not a Slurm task list");
}

TEST(LauncherEnvTest, ProcessEnvironmentAndExplicitArguments) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  auto l = LauncherEnv();
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->source, "open-mpi");
  EXPECT_EQ(l->rank, 1);
  EXPECT_EQ(l->world, 3);

  const Env env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  auto same = ResolveLaunch(std::nullopt, std::nullopt, &env);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->source, "torchrun");
  auto args = ResolveLaunch(0, 4, &env);
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->source, "arguments");
  EXPECT_EQ(args->local_world, 4);
  auto mixed = ResolveLaunch(std::nullopt, 4, &env);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->rank, 1);
  auto bad = ResolveLaunch(3, std::nullopt, &env);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 3 out of range for world 2 (launcher: torchrun)"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
