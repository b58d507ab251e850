#include "parallel/comm/flight_recorder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain::parallel {

struct FlightRecorder::State {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  mutable std::mutex mu;
  std::array<FlightEntry, kFlightEntries> ring{};
  uint64_t next_seq = 1;
  std::string dir;
  int rank = 0;
  // For the signal handler: the paths, prepared while it is safe to allocate.
  char path[512] = {};
  char tmp_path[544] = {};  // path + ".tmp." + 16 random hex digits
};

namespace {

FlightEntry* slot(std::array<FlightEntry, kFlightEntries>& ring, uint64_t seq) {
  return &ring[size_t(seq % kFlightEntries)];
}

std::string describe(const FlightEntry& e, double now, bool with_duration) {
  std::string s = fmt::format("{} #{} on group '{}' ({} rank{}, {}", e.op, e.seq, e.group, e.group_size,
                              e.group_size == 1 ? "" : "s", format_bytes(double(e.bytes)));
  if (e.peer >= 0) s += fmt::format(", peer {}", e.peer);
  s += ")";
  if (with_duration) s += fmt::format(" for {}", format_duration(now - e.start_s));
  return s;
}

// Appends the decimal digits of `v` (signal-safe).
char* put_uint(char* p, uint64_t v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) *p++ = digits[--n];
  return p;
}

char* put_str(char* p, const char* s, size_t max) {
  for (size_t i = 0; i < max && s[i]; ++i) *p++ = s[i];
  return p;
}

// Milliseconds with a sign (signal-safe).
char* put_ms(char* p, double seconds) {
  if (seconds < 0) return put_str(p, "-", 1);
  return put_uint(p, uint64_t(seconds * 1000.0));
}

}  // namespace

FlightRecorder::FlightRecorder() : s_(std::make_unique<State>()) {}

double FlightRecorder::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s_->t0).count();
}

uint64_t FlightRecorder::begin(const char* op, const std::string& group, int group_size, int64_t bytes, int peer) {
  const double t = now();
  std::lock_guard<std::mutex> lock(s_->mu);
  const uint64_t seq = s_->next_seq++;
  FlightEntry& e = *slot(s_->ring, seq);
  e = FlightEntry{};
  e.seq = seq;
  e.op = op;
  std::snprintf(e.group, sizeof e.group, "%s", group.c_str());
  e.group_size = group_size;
  e.bytes = bytes;
  e.peer = peer;
  e.start_s = t;
  return seq;
}

void FlightRecorder::end(uint64_t seq) {
  const double t = now();
  std::lock_guard<std::mutex> lock(s_->mu);
  FlightEntry& e = *slot(s_->ring, seq);
  if (e.seq == seq && e.end_s < 0) e.end_s = t;
}

std::string FlightRecorder::in_flight() const {
  const double t = now();
  std::lock_guard<std::mutex> lock(s_->mu);
  const FlightEntry* oldest = nullptr;
  for (const FlightEntry& e : s_->ring)
    if (e.seq != 0 && e.end_s < 0 && (!oldest || e.seq < oldest->seq)) oldest = &e;
  return oldest ? describe(*oldest, t, true) : "";
}

std::string FlightRecorder::last_finished() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  const FlightEntry* last = nullptr;
  for (const FlightEntry& e : s_->ring)
    if (e.seq != 0 && e.end_s >= 0 && (!last || e.seq > last->seq)) last = &e;
  return last ? describe(*last, 0, false) : "";
}

std::string FlightRecorder::text(int rank) const {
  const double t = now();
  std::lock_guard<std::mutex> lock(s_->mu);
  std::string out = fmt::format(
      "# llmtrain flight record of rank {}: its last {} communication operations, oldest first, at {:.3f}s\n"
      "# seq op group group_size bytes peer start_s end_s (end -1: still in flight)\n",
      rank, kFlightEntries, t);
  const uint64_t first = s_->next_seq > kFlightEntries ? s_->next_seq - kFlightEntries : 1;
  for (uint64_t seq = first; seq < s_->next_seq; ++seq) {
    const FlightEntry& e = s_->ring[size_t(seq % kFlightEntries)];
    if (e.seq != seq) continue;
    out += fmt::format("{} {} {} {} {} {} {:.3f} {:.3f}\n", e.seq, e.op, e.group, e.group_size, e.bytes, e.peer,
                       e.start_s, e.end_s);
  }
  return out;
}

void FlightRecorder::set_dump_dir(const std::string& dir, int rank) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->dir = dir;
  s_->rank = rank;
  const std::string path = dir.empty() ? "" : fmt::format("{}/rank_{:08d}.txt", dir, rank);
  std::snprintf(s_->path, sizeof s_->path, "%s", path.c_str());
  // The signal handler cannot make a random name: it is made here. It creates the file exclusively
  // (a link planted at the name makes it give up, never write through it).
  std::snprintf(s_->tmp_path, sizeof s_->tmp_path, "%s",
                path.empty() ? "" : fmt::format("{}.tmp.{}", path, random_name_suffix()).c_str());
}

std::string FlightRecorder::dump() const {
  std::string dir;
  int rank = 0;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    dir = s_->dir;
    rank = s_->rank;
  }
  if (dir.empty()) return "";
  try {
    FileSystem& fs = default_file_system();
    fs.make_dirs(dir);
    const std::string path = fmt::format("{}/rank_{:08d}.txt", dir, rank);
    write_file_atomic(fs, path, text(rank));
    return path;
  } catch (const std::exception&) {
    return "";  // the record is a diagnosis aid: failing to write it must not hide the real error
  }
}

void FlightRecorder::dump_from_signal() const {
  if (!s_->path[0]) return;
  const int fd = ::open(s_->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char line[256];
  char* p = put_str(line, "# llmtrain flight record (written from a fatal signal handler; times in ms)\n", 200);
  ssize_t ignored = ::write(fd, line, size_t(p - line));
  for (const FlightEntry& e : s_->ring) {
    if (e.seq == 0) continue;
    p = put_uint(line, e.seq);
    *p++ = ' ';
    p = put_str(p, e.op, 40);
    *p++ = ' ';
    p = put_str(p, e.group, sizeof e.group);
    *p++ = ' ';
    p = put_uint(p, uint64_t(e.bytes < 0 ? 0 : e.bytes));
    *p++ = ' ';
    p = put_ms(p, e.start_s);
    *p++ = ' ';
    p = put_ms(p, e.end_s);
    *p++ = '\n';
    ignored = ::write(fd, line, size_t(p - line));
  }
  (void)ignored;
  ::close(fd);
  ::rename(s_->tmp_path, s_->path);
}

FlightRecorder& flight_recorder() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: signal handlers use it
  return *recorder;
}

namespace {

class RecordedWork : public Work {
 public:
  RecordedWork(WorkHandle inner, uint64_t seq) : inner_(std::move(inner)), seq_(seq) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool done() override {
    const bool d = inner_->done();
    if (d) finish();
    return d;
  }

 private:
  void finish() {
    if (seq_ == 0) return;
    flight_recorder().end(seq_);
    seq_ = 0;
  }
  WorkHandle inner_;
  uint64_t seq_;
};

class RecordedComm : public Comm {
 public:
  explicit RecordedComm(std::unique_ptr<Comm> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  void set_timeout(double seconds) override { inner_->set_timeout(seconds); }
  double timeout() const override { return inner_->timeout(); }
  void progress() override { inner_->progress(); }
  std::unique_ptr<Comm> split(int color, int key, std::string name) override {
    const uint64_t seq = start("split", 0, -1);
    auto c = inner_->split(color, key, std::move(name));
    flight_recorder().end(seq);
    return std::make_unique<RecordedComm>(std::move(c));
  }

  void all_reduce(Tensor buf, Reduction op) override {
    run("all_reduce", buf, -1, [&] { inner_->all_reduce(buf, op); });
  }
  void reduce_scatter(Tensor in, Tensor out, Reduction op) override {
    run("reduce_scatter", in, -1, [&] { inner_->reduce_scatter(in, out, op); });
  }
  void all_gather(Tensor in, Tensor out) override {
    run("all_gather", in, -1, [&] { inner_->all_gather(in, out); });
  }
  void broadcast(Tensor buf, int root) override {
    run("broadcast", buf, root, [&] { inner_->broadcast(buf, root); });
  }
  void send(Tensor buf, int peer, int tag) override {
    run("send", buf, peer, [&] { inner_->send(buf, peer, tag); });
  }
  void recv(Tensor buf, int peer, int tag) override {
    run("recv", buf, peer, [&] { inner_->recv(buf, peer, tag); });
  }
  void all_to_all(Tensor in, Tensor out) override {
    run("all_to_all", in, -1, [&] { inner_->all_to_all(in, out); });
  }
  void barrier() override {
    run("barrier", Tensor{}, -1, [&] { inner_->barrier(); });
  }

  WorkHandle all_reduce_async(Tensor buf, Reduction op) override {
    return launch("all_reduce_async", buf, -1, [&] { return inner_->all_reduce_async(buf, op); });
  }
  WorkHandle reduce_scatter_async(Tensor in, Tensor out, Reduction op) override {
    return launch("reduce_scatter_async", in, -1, [&] { return inner_->reduce_scatter_async(in, out, op); });
  }
  WorkHandle all_gather_async(Tensor in, Tensor out) override {
    return launch("all_gather_async", in, -1, [&] { return inner_->all_gather_async(in, out); });
  }
  WorkHandle broadcast_async(Tensor buf, int root) override {
    return launch("broadcast_async", buf, root, [&] { return inner_->broadcast_async(buf, root); });
  }
  WorkHandle send_async(Tensor buf, int peer, int tag) override {
    return launch("send_async", buf, peer, [&] { return inner_->send_async(buf, peer, tag); });
  }
  WorkHandle recv_async(Tensor buf, int peer, int tag) override {
    return launch("recv_async", buf, peer, [&] { return inner_->recv_async(buf, peer, tag); });
  }
  WorkHandle all_to_all_async(Tensor in, Tensor out) override {
    return launch("all_to_all_async", in, -1, [&] { return inner_->all_to_all_async(in, out); });
  }
  WorkHandle barrier_async() override {
    return launch("barrier_async", Tensor{}, -1, [&] { return inner_->barrier_async(); });
  }
  // The wrapped backend's own exchange, whole: Comm's default would split it into separate sends
  // and receives, which a backend that runs them in order (NCCL's point-to-point outside a group)
  // deadlocks on when both ranks receive first.
  WorkHandle exchange_async(std::vector<Transfer> transfers) override {
    int64_t bytes = 0;
    for (const Transfer& t : transfers) bytes += t.buf.data ? int64_t(t.buf.bytes()) : 0;
    const int peer = transfers.size() == 1 ? transfers.front().peer : -1;
    const uint64_t seq = start("exchange_async", bytes, peer);
    WorkHandle w = inner_->exchange_async(std::move(transfers));
    if (!w) {
      flight_recorder().end(seq);
      return w;
    }
    return std::make_unique<RecordedWork>(std::move(w), seq);
  }

 private:
  uint64_t start(const char* op, int64_t bytes, int peer) {
    return flight_recorder().begin(op, inner_->name(), inner_->size(), bytes, peer);
  }
  template <typename F>
  void run(const char* op, const Tensor& buf, int peer, F&& f) {
    const uint64_t seq = start(op, buf.data ? int64_t(buf.bytes()) : 0, peer);
    f();
    flight_recorder().end(seq);
  }
  template <typename F>
  WorkHandle launch(const char* op, const Tensor& buf, int peer, F&& f) {
    const uint64_t seq = start(op, buf.data ? int64_t(buf.bytes()) : 0, peer);
    WorkHandle w = f();
    if (!w) {
      flight_recorder().end(seq);
      return w;
    }
    return std::make_unique<RecordedWork>(std::move(w), seq);
  }

  std::unique_ptr<Comm> inner_;
};

}  // namespace

std::unique_ptr<Comm> with_flight_recorder(std::unique_ptr<Comm> inner) {
  return std::make_unique<RecordedComm>(std::move(inner));
}

}  // namespace llmtrain::parallel
