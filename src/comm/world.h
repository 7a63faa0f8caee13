#pragma once
// The processes of this job. A worker started by mpirun or srun reads its rank and world size from
// the environment and joins the others over MPI; any other process is a world of one.
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace fab {

struct WorldInfo {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the workers on this node
  std::string launcher = "none";       // mpirun, srun, pmi or none
};

// From OpenMPI's OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID / SLURM_STEP_NUM_TASKS (inside srun), or
// PMI_RANK / PMI_SIZE.
WorldInfo world_from_environment();

// A LocalCommunicator for a world of one; otherwise initialises MPI and returns MPI_COMM_WORLD.
// `info` is corrected from MPI (the authority once it runs).
std::unique_ptr<Communicator> join_world(WorldInfo& info, double timeout_seconds);
// Finalises MPI if join_world started it; every communicator must be gone.
void leave_world();

}  // namespace fab
