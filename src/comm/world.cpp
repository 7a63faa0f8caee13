#include "comm/world.h"

#include <cstdlib>

#include "comm/mpi_communicator.h"

namespace fab {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

bool g_mpi_started = false;

}  // namespace

WorldInfo world_from_environment() {
  WorldInfo w;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    w.launcher = "mpirun";
    w.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    w.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("SLURM_STEP_NUM_TASKS")) {  // set inside srun, not in the batch script
    w.launcher = "srun";
    w.rank = env_int("SLURM_PROCID", 0);
    w.size = env_int("SLURM_STEP_NUM_TASKS", 1);
    w.local_rank = env_int("SLURM_LOCALID", 0);
    w.local_size = env_int("SLURM_STEP_TASKS_PER_NODE", 1);  // "8" or "8(x2)": atoi reads the 8
  } else if (std::getenv("PMI_SIZE")) {
    w.launcher = "pmi";
    w.rank = env_int("PMI_RANK", 0);
    w.size = env_int("PMI_SIZE", 1);
    w.local_rank = env_int("MPI_LOCALRANKID", 0);
    w.local_size = env_int("MPI_LOCALNRANKS", 1);
  }
  return w;
}

std::unique_ptr<Communicator> join_world(WorldInfo& info, double timeout_seconds) {
  if (info.size <= 1) return std::make_unique<LocalCommunicator>();
  mpi_initialize();
  g_mpi_started = true;
  auto world = MpiCommunicator::world(timeout_seconds);
  info.rank = world->rank();
  info.size = world->size();
  return world;
}

void leave_world() {
  if (g_mpi_started) mpi_finalize();
  g_mpi_started = false;
}

}  // namespace fab
