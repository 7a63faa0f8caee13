#pragma once
// Collectives over MPI between CPU processes (OpenMPI: shared memory inside a node, TCP across
// nodes). The data-heavy collectives are rings over point-to-point messages, so the bytes each
// rank sends are known exactly (2(N-1)/N of the buffer for an all-reduce) and counted in stats().
// All MPI calls of the process run on one communication thread, in submission order, which keeps
// collectives matched across ranks and lets them overlap the compute threads.
#include <functional>
#include <memory>

#include "comm/communicator.h"

namespace fab {

struct MpiGroup;

class MpiCommunicator final : public Communicator {
 public:
  // The group of every process of the job (MPI_COMM_WORLD). MPI must be initialised.
  static std::unique_ptr<MpiCommunicator> world(double timeout_seconds);
  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  CommHandle all_reduce(float* data, int64_t n, const std::string& what) override;
  CommHandle all_reduce(double* data, int64_t n, const std::string& what) override;
  CommHandle reduce_scatter(float* data, int64_t n, const std::string& what) override;
  CommHandle all_gather(float* data, int64_t n, const std::string& what) override;
  CommHandle broadcast(void* data, int64_t bytes, int root, const std::string& what) override;
  void send(const void* data, int64_t bytes, int peer) override;
  void recv(void* data, int64_t bytes, int peer) override;
  CommHandle isend(const void* data, int64_t bytes, int peer, int tag) override;
  CommHandle irecv(void* data, int64_t bytes, int peer, int tag) override;
  void barrier(const std::string& what) override;
  CommHandle all_to_all(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts,
                        const std::string& what) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  CommStats stats() const override;

 private:
  explicit MpiCommunicator(std::unique_ptr<MpiGroup> group);
  CommHandle submit(const std::string& what, std::function<void(MpiGroup&)> body);
  CommHandle post_point_to_point(bool send, void* data, int64_t bytes, int peer, int tag);
  std::unique_ptr<MpiGroup> group_;
};

// MPI_Init_thread (at least MPI_THREAD_SERIALIZED) and MPI_Finalize; finalize after every
// MpiCommunicator is gone.
void mpi_initialize();
// The MPI library's own version line (callable before MPI_Init).
std::string mpi_library_version();
void mpi_finalize();

}  // namespace fab
