#include "common/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/error.h"

namespace llmtrain {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const char* op, const std::string& path, int error) {
  std::string hint;
  if (error == ENOSPC || error == EDQUOT)
    hint = "the disk is full: free space or point the output elsewhere";
  else if (error == EACCES || error == EPERM || error == EROFS)
    hint = "check the directory's permissions";
  throw environment_error(fmt::format("{} {}: {}", op, path, std::strerror(error)), hint);
}

class PosixFile final : public WritableFile {
 public:
  explicit PosixFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create", path_, errno);
  }
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write", path_, errno);
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
  }
  void sync() override {
    if (::fsync(fd_) != 0) fail("cannot fsync", path_, errno);
  }
  void close() override {
    if (fd_ < 0) return;
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close", path_, errno);
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

class PosixFileSystem final : public FileSystem {
 public:
  std::unique_ptr<WritableFile> create(const std::string& path) override { return std::make_unique<PosixFile>(path); }
  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot rename", from + " to " + to, errno);
  }
  void exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return;
    if (errno != EINVAL && errno != ENOSYS) fail("cannot exchange", a + " and " + b, errno);
    // No RENAME_EXCHANGE here (some network file systems): b aside, a in, b's old contents to a.
    const std::string aside = fmt::format("{}.old.{}", b, random_name_suffix());  // nothing there to replace
    rename(b, aside);
    rename(a, b);
    rename(aside, a);
  }
  void sync_dir(const std::string& dir) override {
    int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail("cannot open directory", dir, errno);
    int rc = ::fsync(fd);
    int error = errno;
    ::close(fd);
    if (rc != 0) fail("cannot fsync directory", dir, error);
  }
  void make_dirs(const std::string& dir) override {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create directory", dir, ec.value());
  }
  void remove_all(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) fail("cannot remove", path, ec.value());
  }
};

// A file of a FaultyFileSystem: each call counts as one operation.
class FaultyFile final : public WritableFile {
 public:
  FaultyFile(FaultyFileSystem& owner, std::unique_ptr<WritableFile> base) : owner_(owner), base_(std::move(base)) {}
  void append(const void* data, size_t size) override {
    owner_.tick("cannot write", base_->path());
    base_->append(data, size);
  }
  void sync() override {
    owner_.tick("cannot fsync", base_->path());
    base_->sync();
  }
  void close() override { base_->close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultyFileSystem& owner_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

FileSystem& default_file_system() {
  static PosixFileSystem fs;
  return fs;
}

void FaultyFileSystem::tick(const char* op, const std::string& path) {
  ++ops_;
  if (fail_at_ > 0 && (ops_ == fail_at_ || (crash_ && ops_ > fail_at_))) {
    failed_ = true;
    fail(op, path, error_);
  }
}

std::unique_ptr<WritableFile> FaultyFileSystem::create(const std::string& path) {
  tick("cannot create", path);
  return std::make_unique<FaultyFile>(*this, base_.create(path));
}

void FaultyFileSystem::rename(const std::string& from, const std::string& to) {
  tick("cannot rename", from + " to " + to);
  base_.rename(from, to);
}

void FaultyFileSystem::exchange(const std::string& a, const std::string& b) {
  tick("cannot exchange", a + " and " + b);
  base_.exchange(a, b);
}

void FaultyFileSystem::remove_all(const std::string& path) {
  tick("cannot remove", path);
  base_.remove_all(path);
}

void FaultyFileSystem::sync_dir(const std::string& dir) {
  tick("cannot fsync directory", dir);
  base_.sync_dir(dir);
}

void FaultyFileSystem::make_dirs(const std::string& dir) {
  tick("cannot create directory", dir);
  base_.make_dirs(dir);
}

// --- PowerLossFileSystem ---------------------------------------------------------------------

namespace {

std::string normal(const std::string& path) {
  std::error_code ec;
  return fs::absolute(path, ec).lexically_normal().string();
}

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(normal(path));
  return (p.has_filename() ? p.parent_path() : p.parent_path().parent_path()).string();
}

uint64_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? uint64_t(st.st_ino) : 0;
}

class PowerLossFile final : public WritableFile {
 public:
  PowerLossFile(PowerLossFileSystem& owner, std::unique_ptr<WritableFile> base)
      : owner_(owner), base_(std::move(base)) {}
  void append(const void* data, size_t size) override {
    base_->append(data, size);
    owner_.note_written(base_->path(), int64_t(size));
  }
  void sync() override {
    base_->sync();
    owner_.note_synced(base_->path());
  }
  void close() override { base_->close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  PowerLossFileSystem& owner_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

PowerLossFileSystem::PowerLossFileSystem(FileSystem& base, std::string root)
    : base_(base), root_(normal(root)), trash_(normal(root) + ".trash") {}

PowerLossFileSystem::~PowerLossFileSystem() {
  std::error_code ec;
  fs::remove_all(trash_, ec);
}

std::string PowerLossFileSystem::aside_path() {
  fs::create_directories(trash_);
  return fmt::format("{}/{}", trash_, next_aside_++);
}

void PowerLossFileSystem::note_written(const std::string& path, int64_t bytes) { data_[inode_of(path)].size += bytes; }

void PowerLossFileSystem::note_synced(const std::string& path) {
  Data& d = data_[inode_of(path)];
  d.synced = d.size;
}

std::unique_ptr<WritableFile> PowerLossFileSystem::create(const std::string& path) {
  const bool existed = fs::exists(path);
  auto f = base_.create(path);
  data_[inode_of(path)] = Data{};
  if (!existed) ops_.push_back({Op::Kind::create, parent_of(path), normal(path), "", ""});
  return std::make_unique<PowerLossFile>(*this, std::move(f));
}

void PowerLossFileSystem::rename(const std::string& from, const std::string& to) {
  std::string aside;
  if (fs::exists(to) && !fs::is_directory(to)) {  // what the rename replaces, kept to restore it
    aside = aside_path();
    base_.rename(to, aside);
  }
  base_.rename(from, to);
  ops_.push_back({Op::Kind::rename, parent_of(to), normal(from), normal(to), aside});
}

void PowerLossFileSystem::exchange(const std::string& a, const std::string& b) {
  base_.exchange(a, b);
  ops_.push_back({Op::Kind::exchange, parent_of(b), normal(a), normal(b), ""});
}

void PowerLossFileSystem::sync_dir(const std::string& dir) {
  base_.sync_dir(dir);
  const std::string d = normal(dir);
  for (Op& op : ops_) {
    if (op.durable || op.dir != d) continue;
    op.durable = true;
    std::error_code ec;
    if (!op.aside.empty()) fs::remove_all(op.aside, ec);  // a replaced file or a removed tree: gone for good
  }
}

void PowerLossFileSystem::make_dirs(const std::string& dir) {
  std::vector<std::string> made;
  for (fs::path p = fs::path(normal(dir)); !p.empty() && !fs::exists(p); p = p.parent_path())
    made.push_back(p.string());
  base_.make_dirs(dir);
  for (auto it = made.rbegin(); it != made.rend(); ++it) ops_.push_back({Op::Kind::mkdir, parent_of(*it), *it, "", ""});
}

void PowerLossFileSystem::remove_all(const std::string& path) {
  if (!fs::exists(fs::symlink_status(path))) return base_.remove_all(path);
  const std::string aside = aside_path();
  base_.rename(path, aside);  // kept until the removal is durable
  ops_.push_back({Op::Kind::remove, parent_of(path), normal(path), "", aside});
}

void PowerLossFileSystem::power_loss() {
  std::error_code ec;
  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    if (it->durable) continue;
    switch (it->kind) {
      case Op::Kind::create:
      case Op::Kind::mkdir:
        fs::remove_all(it->a, ec);
        break;
      case Op::Kind::rename:
        fs::rename(it->b, it->a, ec);
        if (!it->aside.empty()) fs::rename(it->aside, it->b, ec);
        break;
      case Op::Kind::exchange:
        ::renameat2(AT_FDCWD, it->a.c_str(), AT_FDCWD, it->b.c_str(), RENAME_EXCHANGE);
        break;
      case Op::Kind::remove:
        fs::rename(it->aside, it->a, ec);
        break;
    }
  }
  ops_.clear();
  // Data written after its file's last fsync is lost.
  for (const auto& e : fs::recursive_directory_iterator(root_, fs::directory_options::skip_permission_denied, ec)) {
    if (!e.is_regular_file(ec)) continue;
    auto it = data_.find(inode_of(e.path().string()));
    if (it != data_.end() && int64_t(e.file_size(ec)) > it->second.synced)
      fs::resize_file(e.path(), it->second.synced, ec);
  }
  data_.clear();
  fs::remove_all(trash_, ec);
}

void write_file_atomic(FileSystem& fs, const std::string& path, std::string_view contents) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, random_name_suffix());
  std::unique_ptr<WritableFile> f = fs.create(tmp);  // a failure here created nothing to remove
  try {
    f->append(contents.data(), contents.size());
    f->sync();
    f->close();
    fs.rename(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);  // ours: created exclusively above
    throw;
  }
  fs.sync_dir(fs::path(path).parent_path().string());
}

std::string random_name_suffix(int hex_digits) {
  std::string out;
  while (int(out.size()) < hex_digits) {
    uint64_t r = 0;
    if (::getrandom(&r, sizeof r, 0) != sizeof r) r = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
    out += fmt::format("{:016x}", r);
  }
  out.resize(size_t(hex_digits));
  return out;
}

int create_temp_file(const std::string& base, std::string* path, unsigned mode) {
  for (int attempt = 0;; ++attempt) {
    std::string p = fmt::format("{}.tmp.{}", base, random_name_suffix());
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode_t(mode));
    if (fd >= 0) {
      *path = std::move(p);
      return fd;
    }
    if (errno != EEXIST || attempt == 100) fail("cannot create", p, errno);
  }
}

std::string make_temp_dir(const std::string& base) {
  std::string templ = base + ".XXXXXX";
  if (!::mkdtemp(templ.data())) fail("cannot create directory", templ, errno);
  return templ;
}

std::FILE* open_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  std::FILE* f = ::fdopen(fd, "a");
  if (!f) {
    const int error = errno;
    ::close(fd);
    errno = error;
  }
  return f;
}

std::string read_file(const std::string& path, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer returns at once (and is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot read", path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot read", path, errno);
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("cannot read {}: not a regular file (a directory, a device or a pipe)", path),
                "give the path of a file");
  if (st.st_size > max_bytes)
    throw Error(
        fmt::format("cannot read {}: {} bytes, more than the {} this file may have", path, st.st_size, max_bytes),
        "is this the right file?");
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read", path, errno);
    if (n == 0) break;  // shrank while we read: what is there
    got += size_t(n);
  }
  out.resize(got);
  return out;
}

}  // namespace llmtrain
