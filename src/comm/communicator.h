#pragma once
// Collectives between the processes of one group. Every collective is asynchronous: it returns a
// CommHandle at once and runs on a communication thread, so gradient buckets travel while the
// backward pass goes on; wait() blocks until it is done. Every collective has a timeout: a rank
// that never arrives stops the whole job with a message naming it and the collective, instead of
// a silent hang. Backends: MpiCommunicator (CPU tensors), LocalCommunicator (one process).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace fab {

// Traffic and timing of one communicator since it was made, for metrics and tests.
struct CommStats {
  int64_t bytes_sent = 0;      // payload bytes this rank put on the wire
  int64_t collectives = 0;     // collectives completed
  double busy_seconds = 0;     // time some collective of this communicator was in flight
  double blocked_seconds = 0;  // time callers spent blocked in wait()
};

// The completion state of one asynchronous collective, shared by its handle and the thread
// that runs it.
struct CommTask {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::string error;  // set when it failed
  std::string what;   // the collective, for the trace's wait events
};

class CommHandle {
 public:
  CommHandle() = default;
  CommHandle(std::shared_ptr<CommTask> task, std::atomic<double>* blocked_seconds)
      : task_(std::move(task)), blocked_seconds_(blocked_seconds) {}
  // Blocks until the collective completed; throws fab::Error if it failed.
  void wait();
  bool done() const;
  bool valid() const { return task_ != nullptr; }

 private:
  std::shared_ptr<CommTask> task_;
  std::atomic<double>* blocked_seconds_ = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[0, n) becomes the sum over the group. `what` names it in timeout messages.
  virtual CommHandle all_reduce(float* data, int64_t n, const std::string& what) = 0;
  virtual CommHandle all_reduce(double* data, int64_t n, const std::string& what) = 0;
  // In place over data[0, n) split by chunk_range(n, size(), r): afterwards this rank's chunk
  // holds the sum over the group of that chunk; the other chunks hold partial sums (garbage).
  virtual CommHandle reduce_scatter(float* data, int64_t n, const std::string& what) = 0;
  // In place: each rank's chunk of data[0, n) is copied to every rank.
  virtual CommHandle all_gather(float* data, int64_t n, const std::string& what) = 0;
  virtual CommHandle broadcast(void* data, int64_t bytes, int root, const std::string& what) = 0;
  // Point to point, blocking (with the same timeout).
  virtual void send(const void* data, int64_t bytes, int peer) = 0;
  virtual void recv(void* data, int64_t bytes, int peer) = 0;
  // Point to point, non-blocking: posted at once (not queued behind collectives in flight) and
  // done when the handle says so; the buffer must live until then. `tag` (0 <= tag < 2^20) tells
  // apart messages between the same two ranks, so a receive may be posted long before the send.
  // Not part of the collective sequence: the pipeline's stages exchange them in their own order.
  virtual CommHandle isend(const void* data, int64_t bytes, int peer, int tag);
  virtual CommHandle irecv(void* data, int64_t bytes, int peer, int tag);
  virtual void barrier(const std::string& what) = 0;
  // Personalised exchange with counts (MPI_Alltoallv): this rank sends send_counts[r] floats to
  // rank r, taken from `send` in rank order, and receives recv_counts[r] floats from rank r into
  // `recv` in rank order (size() counts each; what rank a sends to b is what b expects from a).
  // The base of expert parallel's token dispatch and combine. A backend without it (NCCL) throws.
  virtual CommHandle all_to_all(const float* send, const int64_t* send_counts, float* recv,
                                const int64_t* recv_counts, const std::string& what);

  // A sub-group: ranks with the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  virtual CommStats stats() const = 0;
};

// Chunk i of n elements cut into `parts`: [first, second). Chunks differ by at most one element.
std::pair<int64_t, int64_t> chunk_range(int64_t n, int parts, int i);

// The group of one process: every collective is complete at once (the data is already the sum).
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommHandle all_reduce(float*, int64_t, const std::string&) override { return finished(); }
  CommHandle all_reduce(double*, int64_t, const std::string&) override { return finished(); }
  CommHandle reduce_scatter(float*, int64_t, const std::string&) override { return finished(); }
  CommHandle all_gather(float*, int64_t, const std::string&) override { return finished(); }
  CommHandle broadcast(void*, int64_t, int, const std::string&) override { return finished(); }
  void send(const void*, int64_t, int peer) override;
  void recv(void*, int64_t, int peer) override;
  void barrier(const std::string&) override {}
  CommHandle all_to_all(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts,
                        const std::string& what) override;
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }
  CommStats stats() const override { return stats_; }

 private:
  CommHandle finished();
  CommStats stats_;
};

}  // namespace fab
