#include "comm/mpi_communicator.h"

#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <deque>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/trace.h"

namespace fab {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRingTag = 1, kPointTag = 2, kArrivalTag = 3;
constexpr int kTaggedBase = 16, kMostTags = 1 << 20;  // isend/irecv tags sit above the others

// The one thread that makes every MPI call after MPI_Init: tasks run in submission order.
class CommThread {
 public:
  // Never destroyed: a worker that exits on an error must not wait for a thread stuck in MPI.
  static CommThread& instance() {
    static CommThread* thread = new CommThread;
    return *thread;
  }
  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      start_locked();
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }
  // Point-to-point posts: run before the next queued job, and from inside a collective's wait,
  // so they are never held up behind collectives in flight.
  void submit_urgent(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      start_locked();
      urgent_.push_back(std::move(job));
    }
    wake_.notify_one();
  }
  // On the communication thread: `poll` runs whenever the thread is idle or waiting inside a
  // collective, until it returns true (a posted request completed).
  void add_poll(std::function<bool()> poll) { polls_.push_back(std::move(poll)); }
  // On the communication thread: posts what jumped the queue and tests what was posted.
  void service() {
    std::deque<std::function<void()>> urgent;
    {
      std::lock_guard lock(mutex_);
      urgent.swap(urgent_);
    }
    for (auto& job : urgent) job();
    for (size_t i = 0; i < polls_.size();) {
      if (polls_[i]()) {
        polls_[i] = std::move(polls_.back());
        polls_.pop_back();
      } else {
        ++i;
      }
    }
  }
  // Runs `job` on the communication thread and waits for it (rethrowing its error).
  void run_and_wait(const std::function<void()>& job) {
    auto task = std::make_shared<CommTask>();
    submit([&job, task] {
      std::string error;
      try {
        job();
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard lock(task->mutex);
      task->error = error;
      task->done = true;
      task->finished.notify_all();
    });
    CommHandle(task, nullptr).wait();
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void start_locked() {
    if (thread_.joinable()) return;
    stopping_ = false;
    thread_ = std::thread([this] { loop(); });
  }
  void loop() {
    trace::name_thread("communication");
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        auto ready = [&] { return stopping_ || !jobs_.empty() || !urgent_.empty(); };
        if (polls_.empty())
          wake_.wait(lock, ready);
        else  // requests in flight: test them every 50 us
          wake_.wait_for(lock, std::chrono::microseconds(50), ready);
        if (stopping_ && jobs_.empty() && urgent_.empty()) return;
        if (!jobs_.empty()) {
          job = std::move(jobs_.front());
          jobs_.pop_front();
        }
      }
      service();
      if (job) job();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_, urgent_;
  std::vector<std::function<bool()>> polls_;  // communication thread only
  std::thread thread_;
  bool stopping_ = false;
};

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <>
MPI_Datatype mpi_type<char>() { return MPI_BYTE; }

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace

// One MPI communicator and what the timeout needs to know about it. Touched only on the
// communication thread, except `stats` (under its mutex) and `timeout`.
struct MpiGroup {
  MPI_Comm data = MPI_COMM_NULL;     // ring and point-to-point messages
  MPI_Comm control = MPI_COMM_NULL;  // arrival notices, so they never mix with data
  int rank = 0, size = 1;
  std::atomic<double> timeout{1800};

  mutable std::mutex stats_mutex;
  CommStats stats;  // blocked_seconds is kept in `blocked` instead
  std::atomic<double> blocked{0};

  // Every collective starts by telling each peer its sequence number. When one times out, the
  // peers whose notice for it never came are the ones that never started it.
  int64_t sequence = 0;
  std::string current;  // what the collective in flight is
  Clock::time_point deadline;
  std::vector<int64_t> arrived, inbox;
  std::vector<MPI_Request> arrival_recvs;
  std::deque<std::pair<MPI_Request, std::unique_ptr<int64_t>>> arrival_sends;
  // Where a reduce-scatter receives its peer's chunk: kept between collectives, so its pages are
  // not faulted in again for every bucket.
  std::vector<char> incoming;

  void open(MPI_Comm comm) {
    MPI_Comm_dup(comm, &data);
    MPI_Comm_dup(comm, &control);
    MPI_Comm_rank(data, &rank);
    MPI_Comm_size(data, &size);
    arrived.assign(size_t(size), 0);
    inbox.assign(size_t(size), 0);
    arrival_recvs.assign(size_t(size), MPI_REQUEST_NULL);
    for (int p = 0; p < size; ++p)
      if (p != rank) post_arrival_recv(p);
  }

  void post_arrival_recv(int peer) {
    MPI_Irecv(&inbox[size_t(peer)], 1, MPI_INT64_T, peer, kArrivalTag, control, &arrival_recvs[size_t(peer)]);
  }

  void begin(const std::string& what) {
    ++sequence;
    current = what;
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout.load()));
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      auto value = std::make_unique<int64_t>(sequence);
      MPI_Request request;
      MPI_Isend(value.get(), 1, MPI_INT64_T, p, kArrivalTag, control, &request);
      arrival_sends.emplace_back(request, std::move(value));
    }
  }

  void poll_arrivals() {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      int flag = 0;
      MPI_Test(&arrival_recvs[size_t(p)], &flag, MPI_STATUS_IGNORE);
      if (flag) {
        arrived[size_t(p)] = inbox[size_t(p)];
        post_arrival_recv(p);
      }
    }
    while (!arrival_sends.empty()) {
      int flag = 0;
      MPI_Test(&arrival_sends.front().first, &flag, MPI_STATUS_IGNORE);
      if (!flag) break;
      arrival_sends.pop_front();
    }
  }

  // Waits for `requests`, polling (MPI progresses only inside its calls) with a short back-off so
  // the compute threads keep the cores. `peer` is whom the data is expected from.
  void wait(MPI_Request* requests, int n, int peer) {
    for (int spins = 0;; ++spins) {
      int flag = 0;
      MPI_Testall(n, requests, &flag, MPI_STATUSES_IGNORE);
      if (flag) return;
      poll_arrivals();
      CommThread::instance().service();
      if (Clock::now() > deadline) timed_out(peer);
      if (spins > 200) ::usleep(spins > 2000 ? 200 : 20);
      else sched_yield();
    }
  }

  int to_world(int group_rank) const {
    MPI_Group mine, all;
    MPI_Comm_group(data, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    int out = -1;
    MPI_Group_translate_ranks(mine, 1, &group_rank, all, &out);
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    return out;
  }

  [[noreturn]] void timed_out(int peer) {
    std::string missing;
    for (int p = 0; p < size; ++p)
      if (p != rank && arrived[size_t(p)] < sequence) missing += (missing.empty() ? "" : ", ") + std::to_string(to_world(p));
    const std::string why = missing.empty()
        ? format("every rank started it; rank {} sent no data (stuck or dead mid-transfer)", to_world(peer))
        : format("rank {} never started it (dead, hung, or stuck before this collective)", missing);
    std::fprintf(stderr, "fabrica: rank %d: collective '%s' (#%lld of a group of %d) did not finish within %.0f s: %s\n",
                 world_rank(), current.c_str(), (long long)sequence, size, timeout.load(), why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 75);
    std::_Exit(75);
  }

  int64_t bytes_sent() const {
    std::lock_guard lock(stats_mutex);
    return stats.bytes_sent;
  }
  void count_sent(int64_t bytes, bool collective_done, double seconds) {
    std::lock_guard lock(stats_mutex);
    stats.bytes_sent += bytes;
    if (collective_done) {
      ++stats.collectives;
      stats.busy_seconds += seconds;
    }
  }

  // Sends `send_count` elements to `right` while receiving `recv_count` from `left`, in messages
  // of at most INT_MAX/2 elements.
  template <typename T>
  void exchange(const T* send, int64_t send_count, int right, T* recv, int64_t recv_count, int left, int tag) {
    constexpr int64_t kPiece = INT_MAX / 2;
    for (int64_t done = 0; done < std::max(send_count, recv_count); done += kPiece) {
      MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      const int64_t rn = std::clamp<int64_t>(recv_count - done, 0, kPiece);
      const int64_t sn = std::clamp<int64_t>(send_count - done, 0, kPiece);
      if (rn > 0) MPI_Irecv(recv + done, int(rn), mpi_type<T>(), left, tag, data, &r[0]);
      if (sn > 0) MPI_Isend(send + done, int(sn), mpi_type<T>(), right, tag, data, &r[1]);
      wait(r, 2, left);
      count_sent(sn * int64_t(sizeof(T)), false, 0);
    }
  }

  int mod(int i) const { return ((i % size) + size) % size; }

  // Ring reduce-scatter: after step s, the chunk a rank sends holds s + 2 ranks' contributions;
  // after size - 1 steps rank r holds the full sum of chunk r.
  template <typename T>
  void reduce_scatter(T* buffer, int64_t n) {
    if (size == 1) return;  // nothing to receive: no receive buffer the size of the whole buffer
    const int left = mod(rank - 1), right = mod(rank + 1);
    const size_t largest_chunk = size_t(chunk_range(n, size, 0).second + 1) * sizeof(T);
    if (incoming.size() < largest_chunk) incoming.resize(largest_chunk);
    T* received = reinterpret_cast<T*>(incoming.data());
    for (int s = 0; s + 1 < size; ++s) {
      const auto [sb, se] = chunk_range(n, size, mod(rank - s - 1));
      const auto [rb, re] = chunk_range(n, size, mod(rank - s - 2));
      exchange(buffer + sb, se - sb, right, received, re - rb, left, kRingTag);
      T* dst = buffer + rb;
      for (int64_t i = 0; i < re - rb; ++i) dst[i] += received[i];
    }
  }

  // Ring all-gather: at step s a rank forwards the chunk it received at step s - 1.
  template <typename T>
  void all_gather(T* buffer, int64_t n) {
    const int left = mod(rank - 1), right = mod(rank + 1);
    for (int s = 0; s + 1 < size; ++s) {
      const auto [sb, se] = chunk_range(n, size, mod(rank - s));
      const auto [rb, re] = chunk_range(n, size, mod(rank - s - 1));
      exchange(buffer + sb, se - sb, right, buffer + rb, re - rb, left, kRingTag);
    }
  }

  // Before freeing: every peer's notices for every collective are in, every notice sent is out.
  void drain() {
    const auto until = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      poll_arrivals();
      bool all_in = arrival_sends.empty();
      for (int p = 0; p < size; ++p) all_in = all_in && (p == rank || arrived[size_t(p)] >= sequence);
      if (all_in || Clock::now() > until) break;
      ::usleep(100);
    }
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      MPI_Cancel(&arrival_recvs[size_t(p)]);
      MPI_Wait(&arrival_recvs[size_t(p)], MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&data);
    MPI_Comm_free(&control);
  }
};

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(double timeout_seconds) {
  auto group = std::make_unique<MpiGroup>();
  group->timeout = timeout_seconds;
  CommThread::instance().run_and_wait([&] { group->open(MPI_COMM_WORLD); });
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(group)));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<MpiGroup> group) : group_(std::move(group)) {}

MpiCommunicator::~MpiCommunicator() {
  MpiGroup* g = group_.get();
  CommThread::instance().run_and_wait([g] { g->drain(); });
}

int MpiCommunicator::rank() const { return group_->rank; }
int MpiCommunicator::size() const { return group_->size; }

CommStats MpiCommunicator::stats() const {
  std::lock_guard lock(group_->stats_mutex);
  CommStats s = group_->stats;
  s.blocked_seconds = group_->blocked.load();
  return s;
}

CommHandle MpiCommunicator::submit(const std::string& what, std::function<void(MpiGroup&)> body) {
  auto task = std::make_shared<CommTask>();
  task->what = what;
  MpiGroup* g = group_.get();
  CommThread::instance().submit([g, task, what, body = std::move(body)] {
    const auto start = Clock::now();
    const int64_t sent_before = g->bytes_sent();
    std::string error;
    try {
      g->begin(what);
      body(*g);
    } catch (const std::exception& e) {
      error = format("collective '{}': {}", what, e.what());
    }
    const auto end = Clock::now();
    g->count_sent(0, true, std::chrono::duration<double>(end - start).count());
    if (trace::recording()) trace::complete(trace::kCommunication, what, start, end, g->bytes_sent() - sent_before);
    std::lock_guard lock(task->mutex);
    task->error = error;
    task->done = true;
    task->finished.notify_all();
  });
  return CommHandle(task, &group_->blocked);
}

CommHandle MpiCommunicator::all_reduce(float* data, int64_t n, const std::string& what) {
  return submit(what, [data, n](MpiGroup& g) {
    g.reduce_scatter(data, n);
    g.all_gather(data, n);
  });
}

CommHandle MpiCommunicator::all_reduce(double* data, int64_t n, const std::string& what) {
  return submit(what, [data, n](MpiGroup& g) {
    g.reduce_scatter(data, n);
    g.all_gather(data, n);
  });
}

CommHandle MpiCommunicator::reduce_scatter(float* data, int64_t n, const std::string& what) {
  return submit(what, [data, n](MpiGroup& g) { g.reduce_scatter(data, n); });
}

CommHandle MpiCommunicator::all_gather(float* data, int64_t n, const std::string& what) {
  return submit(what, [data, n](MpiGroup& g) { g.all_gather(data, n); });
}

CommHandle MpiCommunicator::broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  return submit(what, [data, bytes, root](MpiGroup& g) {
    FAB_CHECK(bytes <= INT_MAX, "broadcast of {} bytes", bytes);
    MPI_Request request;
    MPI_Ibcast(data, int(bytes), MPI_BYTE, root, g.data, &request);
    g.wait(&request, 1, root);
  });
}

// MPI_Ialltoallv (int counts and displacements: each side's total under INT_MAX elements); the
// bytes sent to the other ranks count in stats().
CommHandle MpiCommunicator::all_to_all(const float* send, const int64_t* send_counts, float* recv,
                                       const int64_t* recv_counts, const std::string& what) {
  const int n = size();
  std::vector<int> counts(size_t(4 * n));  // send counts, send displacements, recv counts, recv displacements
  int64_t sent = 0, send_total = 0, recv_total = 0;
  for (int r = 0; r < n; ++r) {
    FAB_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "all_to_all '{}': a negative count", what);
    counts[size_t(r)] = int(send_counts[r]);
    counts[size_t(n + r)] = int(send_total);
    counts[size_t(2 * n + r)] = int(recv_counts[r]);
    counts[size_t(3 * n + r)] = int(recv_total);
    send_total += send_counts[r];
    recv_total += recv_counts[r];
    if (r != rank()) sent += send_counts[r] * int64_t(sizeof(float));
  }
  FAB_CHECK(send_total <= INT_MAX && recv_total <= INT_MAX, "all_to_all '{}' of {} / {} elements", what, send_total,
            recv_total);
  return submit(what, [send, recv, counts = std::move(counts), n, sent](MpiGroup& g) {
    MPI_Request request;
    MPI_Ialltoallv(send, counts.data(), counts.data() + n, MPI_FLOAT, recv, counts.data() + 2 * n,
                   counts.data() + 3 * n, MPI_FLOAT, g.data, &request);
    g.wait(&request, 1, (g.rank + 1) % n);
    g.count_sent(sent, false, 0);
  });
}

void MpiCommunicator::send(const void* data, int64_t bytes, int peer) {
  submit(format("send to rank {}", peer), [data, bytes, peer](MpiGroup& g) {
    g.exchange(static_cast<const char*>(data), bytes, peer, static_cast<char*>(nullptr), 0, peer, kPointTag);
  }).wait();
}

void MpiCommunicator::recv(void* data, int64_t bytes, int peer) {
  submit(format("recv from rank {}", peer), [data, bytes, peer](MpiGroup& g) {
    g.exchange(static_cast<const char*>(nullptr), 0, peer, static_cast<char*>(data), bytes, peer, kPointTag);
  }).wait();
}

CommHandle MpiCommunicator::isend(const void* data, int64_t bytes, int peer, int tag) {
  return post_point_to_point(true, const_cast<void*>(data), bytes, peer, tag);
}

CommHandle MpiCommunicator::irecv(void* data, int64_t bytes, int peer, int tag) {
  return post_point_to_point(false, data, bytes, peer, tag);
}

// Posts one MPI_Isend/MPI_Irecv from the communication thread and tests it there until it
// completes; one that has not completed within the timeout stops the job naming the peer.
CommHandle MpiCommunicator::post_point_to_point(bool send, void* data, int64_t bytes, int peer, int tag) {
  FAB_CHECK(bytes >= 0 && bytes <= INT_MAX, "point-to-point message of {} bytes", bytes);
  FAB_CHECK(tag >= 0 && tag < kMostTags, "point-to-point tag {}", tag);
  FAB_CHECK(peer >= 0 && peer < size() && peer != rank(), "point-to-point peer {} in a group of {}", peer, size());
  auto task = std::make_shared<CommTask>();
  task->what = format("{} rank {} (tag {})", send ? "send to" : "receive from", peer, tag);  // as traced waits name it
  MpiGroup* g = group_.get();
  CommThread::instance().submit_urgent([g, task, send, data, bytes, peer, tag] {
    auto request = std::make_shared<MPI_Request>(MPI_REQUEST_NULL);
    if (send) {
      MPI_Isend(data, int(bytes), MPI_BYTE, peer, kTaggedBase + tag, g->data, request.get());
      g->count_sent(bytes, false, 0);
    } else {
      MPI_Irecv(data, int(bytes), MPI_BYTE, peer, kTaggedBase + tag, g->data, request.get());
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(g->timeout.load()));
    CommThread::instance().add_poll([g, task, request, deadline, send, bytes, peer, tag] {
      int flag = 0;
      MPI_Test(request.get(), &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        if (Clock::now() <= deadline) return false;
        std::fprintf(stderr, "fabrica: rank %d: %s of %lld bytes (tag %d) %s rank %d did not finish within %.0f s\n",
                     world_rank(), send ? "send" : "receive", (long long)bytes, tag, send ? "to" : "from",
                     g->to_world(peer), g->timeout.load());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 75);
        std::_Exit(75);
      }
      std::lock_guard lock(task->mutex);
      task->done = true;
      task->finished.notify_all();
      return true;
    });
  });
  return CommHandle(task, &g->blocked);
}

void MpiCommunicator::barrier(const std::string& what) {
  submit(what, [](MpiGroup& g) {
    MPI_Request request;
    MPI_Ibarrier(g.data, &request);
    g.wait(&request, 1, g.mod(g.rank - 1));
  }).wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  auto group = std::make_unique<MpiGroup>();
  group->timeout = group_->timeout.load();
  MpiGroup* parent = group_.get();
  CommThread::instance().run_and_wait([&] {
    MPI_Comm sub;
    MPI_Comm_split(parent->data, color, key, &sub);
    group->open(sub);
    MPI_Comm_free(&sub);
  });
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(group)));
}

void mpi_initialize() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  FAB_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI provides thread level {}, Fabrica needs MPI_THREAD_SERIALIZED",
            provided);
}

void mpi_finalize() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  CommThread::instance().stop();
  MPI_Finalize();  // on the thread that initialised MPI, as the standard asks
}

}  // namespace fab

namespace fab {

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, size_t(length));
  const size_t comma = version.find(',');
  return version.substr(0, comma);
}

}  // namespace fab
