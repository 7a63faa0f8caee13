#pragma once
// Collectives between processes over NCCL, on device pointers of this process's CUDA device
// (the CUDA backend's). Each collective waits for the work already queued on the compute stream,
// runs on a stream of its own, and completes its CommHandle when the GPU has finished it: a
// watcher thread polls the completion event and ncclCommGetAsyncError, and past the timeout it
// aborts the communicator (ncclCommAbort) with a message naming the collective and the rank.
// Compiled only in CUDA builds. Not yet run on a GPU.
#include <array>
#include <memory>

#include "comm/communicator.h"

namespace fab {

// NCCL's unique id as plain bytes (NCCL_UNIQUE_ID_BYTES), so this header needs no nccl.h.
struct NcclId {
  std::array<char, 128> bytes{};
};
NcclId nccl_unique_id();

class NcclCommunicator final : public Communicator {
 public:
  // Member `rank` of a group of `size` processes that share `id`.
  static std::unique_ptr<NcclCommunicator> create(const NcclId& id, int rank, int size, double timeout_seconds);
  // The group of `bootstrap`'s processes (the MPI world, say): its rank 0 makes the id and
  // broadcasts it through `bootstrap`.
  static std::unique_ptr<NcclCommunicator> from(Communicator& bootstrap, double timeout_seconds);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  CommHandle all_reduce(float* data, int64_t n, const std::string& what) override;
  CommHandle all_reduce(double* data, int64_t n, const std::string& what) override;
  CommHandle reduce_scatter(float* data, int64_t n, const std::string& what) override;
  CommHandle all_gather(float* data, int64_t n, const std::string& what) override;
  CommHandle broadcast(void* data, int64_t bytes, int root, const std::string& what) override;
  void send(const void* data, int64_t bytes, int peer) override;
  void recv(void* data, int64_t bytes, int peer) override;
  void barrier(const std::string& what) override;
  // Not yet: throws, naming the collective (expert parallel's exchange runs over MPI on the CPU).
  CommHandle all_to_all(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts,
                        const std::string& what) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  CommStats stats() const override;

  struct State;

 private:
  explicit NcclCommunicator(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace fab
