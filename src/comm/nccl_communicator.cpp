#include "comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "kernels/cuda/cuda_util.h"

#define FAB_NCCL_CHECK(call)                                                                            \
  do {                                                                                                  \
    const ncclResult_t fab_nccl_result_ = (call);                                                       \
    FAB_CHECK(fab_nccl_result_ == ncclSuccess, "NCCL call {} failed: {}", #call,                        \
              ncclGetErrorString(fab_nccl_result_));                                                    \
  } while (0)

namespace fab {
namespace {

using Clock = std::chrono::steady_clock;

// One collective in flight: its handle's task, the event recorded after it on the NCCL stream.
struct Pending {
  std::shared_ptr<CommTask> task;
  cudaEvent_t done = nullptr;
  std::string what;
  int64_t bytes_sent = 0;
  Clock::time_point start;
};

void finish(CommTask& task, const std::string& error) {
  std::lock_guard lock(task.mutex);
  task.done = true;
  task.error = error;
  task.finished.notify_all();
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  cudaStream_t nccl_stream = nullptr;
  std::atomic<double> timeout{1800};
  std::atomic<double> blocked{0};
  int64_t sequence = 0;

  std::mutex mutex;  // guards everything below
  std::condition_variable wake;
  std::deque<Pending> pending;
  CommStats stats;
  std::string aborted;  // why the communicator was aborted, once it was
  bool stopping = false;
  std::thread watcher;

  void watch();
  bool poll_front(std::unique_lock<std::mutex>& lock);
  void abort_all(const std::string& why, std::unique_lock<std::mutex>& lock);
  CommHandle launch(const std::string& what, int64_t bytes_sent, const std::function<ncclResult_t()>& body);
};

// Completes collectives in the order they were queued (one NCCL stream runs them in order).
void NcclCommunicator::State::watch() {
  cudaSetDevice(device);
  std::unique_lock lock(mutex);
  while (true) {
    wake.wait(lock, [&] { return stopping || !pending.empty(); });
    if (pending.empty()) return;  // stopping with nothing left
    if (!poll_front(lock)) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
  }
}

// True when the front collective finished (or everything was aborted).
bool NcclCommunicator::State::poll_front(std::unique_lock<std::mutex>& lock) {
  Pending& p = pending.front();
  const cudaError_t st = cudaEventQuery(p.done);
  if (st == cudaSuccess) {
    const double seconds = std::chrono::duration<double>(Clock::now() - p.start).count();
    stats.busy_seconds += seconds;
    stats.bytes_sent += p.bytes_sent;
    ++stats.collectives;
    cudaEventDestroy(p.done);
    auto task = p.task;
    pending.pop_front();
    finish(*task, "");
    return true;
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  const double waited = std::chrono::duration<double>(Clock::now() - p.start).count();
  if (st != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress)) {
    abort_all(format("NCCL {} failed on rank {} of {}: {}", p.what, rank, size,
                     st != cudaErrorNotReady ? cudaGetErrorString(st) : ncclGetErrorString(async)),
              lock);
    return true;
  }
  if (waited > timeout.load()) {
    abort_all(format("NCCL {} timed out after {} s on rank {} of {} (a rank did not arrive, or died); the "
                     "communicator was aborted",
                     p.what, timeout.load(), rank, size),
              lock);
    return true;
  }
  return false;
}

void NcclCommunicator::State::abort_all(const std::string& why, std::unique_lock<std::mutex>& lock) {
  aborted = why;
  std::deque<Pending> failed;
  failed.swap(pending);
  lock.unlock();
  ncclCommAbort(comm);  // stops the kernels still waiting for the missing rank
  comm = nullptr;
  for (Pending& p : failed) {
    cudaEventDestroy(p.done);
    finish(*p.task, why);
  }
  lock.lock();
}

// Orders the collective after the compute stream's queued work, runs `body` on the NCCL stream
// and hands its completion to the watcher.
CommHandle NcclCommunicator::State::launch(const std::string& what, int64_t bytes_sent,
                                           const std::function<ncclResult_t()>& body) {
  {
    std::lock_guard lock(mutex);
    FAB_CHECK(aborted.empty(), "NCCL {} on a communicator that was aborted: {}", what, aborted);
  }
  cudaEvent_t ready, done;
  FAB_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  FAB_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  FAB_CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
  FAB_CUDA_CHECK(cudaStreamWaitEvent(nccl_stream, ready, 0));
  cudaEventDestroy(ready);  // released once the wait is satisfied
  const ncclResult_t r = body();
  FAB_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL {} could not start on rank {}: {}", what, rank,
            ncclGetErrorString(r));
  FAB_CUDA_CHECK(cudaEventRecord(done, nccl_stream));
  auto task = std::make_shared<CommTask>();
  std::lock_guard lock(mutex);
  pending.push_back({task, done, format("{} (#{})", what, sequence++), bytes_sent, Clock::now()});
  wake.notify_all();
  return CommHandle(task, &blocked);
}

NcclId nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NCCL unique id size");
  ncclUniqueId id;
  FAB_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof id);
  return out;
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<State> state) : s_(std::move(state)) {
  s_->watcher = std::thread([s = s_.get()] { s->watch(); });
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const NcclId& id, int rank, int size,
                                                           double timeout_seconds) {
  auto s = std::make_unique<State>();
  cuda::stream();  // selects this process's device
  FAB_CUDA_CHECK(cudaGetDevice(&s->device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes.data(), sizeof nid);
  FAB_NCCL_CHECK(ncclCommInitRank(&s->comm, size, nid, rank));
  FAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s->nccl_stream, cudaStreamNonBlocking));
  s->rank = rank;
  s->size = size;
  s->timeout = timeout_seconds;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(s)));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::from(Communicator& bootstrap, double timeout_seconds) {
  NcclId id;
  if (bootstrap.rank() == 0) id = nccl_unique_id();
  bootstrap.broadcast(id.bytes.data(), int64_t(id.bytes.size()), 0, "NCCL unique id").wait();
  return create(id, bootstrap.rank(), bootstrap.size(), timeout_seconds);
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard lock(s_->mutex);
    s_->stopping = true;
    s_->wake.notify_all();
  }
  s_->watcher.join();  // completes (or times out) whatever is still in flight
  if (s_->comm) ncclCommDestroy(s_->comm);
  if (s_->nccl_stream) cudaStreamDestroy(s_->nccl_stream);
}

int NcclCommunicator::rank() const { return s_->rank; }
int NcclCommunicator::size() const { return s_->size; }

// Bytes a ring puts on the wire per rank: all-reduce 2(N-1)/N of the buffer, reduce-scatter and
// all-gather (N-1)/N.
static int64_t ring_bytes(int64_t bytes, int size, int passes) {
  return size <= 1 ? 0 : passes * bytes * (size - 1) / size;
}

CommHandle NcclCommunicator::all_reduce(float* data, int64_t n, const std::string& what) {
  State& s = *s_;
  return s.launch("all_reduce " + what, ring_bytes(n * 4, s.size, 2), [&] {
    return ncclAllReduce(data, data, size_t(n), ncclFloat32, ncclSum, s.comm, s.nccl_stream);
  });
}

CommHandle NcclCommunicator::all_reduce(double* data, int64_t n, const std::string& what) {
  State& s = *s_;
  return s.launch("all_reduce " + what, ring_bytes(n * 8, s.size, 2), [&] {
    return ncclAllReduce(data, data, size_t(n), ncclFloat64, ncclSum, s.comm, s.nccl_stream);
  });
}

// In place. Equal chunks: one ncclReduceScatter (its in-place form writes rank r's chunk at
// data + r * n / size, which is chunk_range's). Unequal chunks: one ncclReduce per chunk to its
// owner, grouped.
CommHandle NcclCommunicator::reduce_scatter(float* data, int64_t n, const std::string& what) {
  State& s = *s_;
  return s.launch("reduce_scatter " + what, ring_bytes(n * 4, s.size, 1), [&] {
    if (n % s.size == 0) {
      const size_t count = size_t(n / s.size);
      return ncclReduceScatter(data, data + count * size_t(s.rank), count, ncclFloat32, ncclSum, s.comm,
                               s.nccl_stream);
    }
    ncclGroupStart();
    for (int r = 0; r < s.size; ++r) {
      const auto [b, e] = chunk_range(n, s.size, r);
      ncclReduce(data + b, data + b, size_t(e - b), ncclFloat32, ncclSum, r, s.comm, s.nccl_stream);
    }
    return ncclGroupEnd();
  });
}

CommHandle NcclCommunicator::all_gather(float* data, int64_t n, const std::string& what) {
  State& s = *s_;
  return s.launch("all_gather " + what, ring_bytes(n * 4, s.size, 1), [&] {
    if (n % s.size == 0) {
      const size_t count = size_t(n / s.size);
      return ncclAllGather(data + count * size_t(s.rank), data, count, ncclFloat32, s.comm, s.nccl_stream);
    }
    ncclGroupStart();
    for (int r = 0; r < s.size; ++r) {
      const auto [b, e] = chunk_range(n, s.size, r);
      ncclBroadcast(data + b, data + b, size_t(e - b), ncclFloat32, r, s.comm, s.nccl_stream);
    }
    return ncclGroupEnd();
  });
}

CommHandle NcclCommunicator::all_to_all(const float*, const int64_t*, float*, const int64_t*, const std::string& what) {
  throw Error(format("all_to_all ('{}') over NCCL is not supported yet", what));
}

CommHandle NcclCommunicator::broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  State& s = *s_;
  return s.launch("broadcast " + what, s.rank == root ? bytes : 0, [&] {
    return ncclBroadcast(data, data, size_t(bytes), ncclUint8, root, s.comm, s.nccl_stream);
  });
}

void NcclCommunicator::send(const void* data, int64_t bytes, int peer) {
  State& s = *s_;
  s.launch(format("send to rank {}", peer), bytes, [&] {
     return ncclSend(data, size_t(bytes), ncclUint8, peer, s.comm, s.nccl_stream);
   }).wait();
}

void NcclCommunicator::recv(void* data, int64_t bytes, int peer) {
  State& s = *s_;
  s.launch(format("recv from rank {}", peer), 0, [&] {
     return ncclRecv(data, size_t(bytes), ncclUint8, peer, s.comm, s.nccl_stream);
   }).wait();
}

// NCCL has no barrier: an all-reduce of one float, waited for.
void NcclCommunicator::barrier(const std::string& what) {
  auto* one = static_cast<float*>(cuda::scratch(sizeof(float)));
  all_reduce(one, 1, "barrier " + what).wait();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  auto s = std::make_unique<State>();
  s->device = s_->device;
  FAB_NCCL_CHECK(ncclCommSplit(s_->comm, color, key, &s->comm, nullptr));
  FAB_NCCL_CHECK(ncclCommCount(s->comm, &s->size));
  FAB_NCCL_CHECK(ncclCommUserRank(s->comm, &s->rank));
  FAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s->nccl_stream, cudaStreamNonBlocking));
  s->timeout = s_->timeout.load();
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(s)));
}

CommStats NcclCommunicator::stats() const {
  std::lock_guard lock(s_->mutex);
  CommStats out = s_->stats;
  out.blocked_seconds = s_->blocked.load();
  return out;
}

}  // namespace fab
