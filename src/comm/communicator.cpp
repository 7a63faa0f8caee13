#include "comm/communicator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/trace.h"

namespace fab {

void CommHandle::wait() {
  if (!task_) return;
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(task_->mutex);
  const bool blocks = !task_->done;
  task_->finished.wait(lock, [&] { return task_->done; });
  const auto end = std::chrono::steady_clock::now();
  if (blocked_seconds_) blocked_seconds_->fetch_add(std::chrono::duration<double>(end - start).count());
  if (blocks && trace::recording()) trace::complete(trace::kWait, "wait: " + task_->what, start, end);
  if (!task_->error.empty()) throw Error(task_->error);
}

bool CommHandle::done() const {
  if (!task_) return true;
  std::lock_guard lock(task_->mutex);
  return task_->done;
}

std::pair<int64_t, int64_t> chunk_range(int64_t n, int parts, int i) {
  return {n * i / parts, n * (i + 1) / parts};
}

CommHandle Communicator::isend(const void*, int64_t, int peer, int) {
  throw Error(format("this communicator has no non-blocking send (to rank {})", peer));
}

CommHandle Communicator::irecv(void*, int64_t, int peer, int) {
  throw Error(format("this communicator has no non-blocking receive (from rank {})", peer));
}

CommHandle Communicator::all_to_all(const float*, const int64_t*, float*, const int64_t*, const std::string& what) {
  throw Error(format("all_to_all ('{}') is not supported by this communicator yet", what));
}

CommHandle LocalCommunicator::all_to_all(const float* send, const int64_t* send_counts, float* recv,
                                         const int64_t* recv_counts, const std::string& what) {
  FAB_CHECK(send_counts[0] == recv_counts[0], "all_to_all '{}': sends {} to itself but expects {}", what,
            send_counts[0], recv_counts[0]);
  if (send != recv) std::copy(send, send + send_counts[0], recv);
  return finished();
}

CommHandle LocalCommunicator::finished() {
  auto task = std::make_shared<CommTask>();
  task->done = true;
  ++stats_.collectives;
  return CommHandle(task, nullptr);
}

void LocalCommunicator::send(const void*, int64_t, int peer) {
  FAB_CHECK(false, "send to rank {} in a group of one process", peer);
}

void LocalCommunicator::recv(void*, int64_t, int peer) {
  FAB_CHECK(false, "recv from rank {} in a group of one process", peer);
}

}  // namespace fab
