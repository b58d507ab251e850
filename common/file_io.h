// File output behind a small interface (leveldb's Env, reduced to what we write): checkpoints,
// run-directory files and anything else that must survive a crash go through FileSystem, so a test
// can make the n-th operation fail (EIO, ENOSPC) and check that nothing already committed is lost.
//
// Rule a reader could get wrong: a file is committed only by write_file_atomic() or by writing a
// temporary name, sync()ing it, renaming it and sync_dir()ing its directory, in that order. A
// rename without the fsyncs around it can leave an empty or missing file after a power loss.
#pragma once

#include <cstddef>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain {

// Every failure throws llmtrain::Error (environment kind) naming the operation, the path and the
// system's reason.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual void append(const void* data, size_t size) = 0;
  virtual void sync() = 0;   // fsync: data and metadata on stable storage
  virtual void close() = 0;  // idempotent; the destructor closes without throwing
  virtual const std::string& path() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates a new file for writing: exclusively (O_CREAT | O_EXCL | O_NOFOLLOW), so an existing
  // file, or a link planted at the name, is an error rather than something written through.
  virtual std::unique_ptr<WritableFile> create(const std::string& path) = 0;
  // rename(2): atomically replaces `to` when it exists (a directory only when `to` is empty or absent).
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE): how a directory replaces a
  // non-empty one with no moment at which neither exists. Where the file system cannot, the old
  // one is renamed aside first (a short window without either).
  virtual void exchange(const std::string& a, const std::string& b) = 0;
  // Makes a directory's entries (creations, renames) durable.
  virtual void sync_dir(const std::string& dir) = 0;
  // mkdir -p.
  virtual void make_dirs(const std::string& dir) = 0;
  // rm -rf; no error when absent.
  virtual void remove_all(const std::string& path) = 0;
};

// The real file system.
FileSystem& default_file_system();

// A FileSystem that forwards to another and makes one chosen operation fail, for tests of
// interrupted writes: the `fail_at`-th operation (1-based, counting create, append, sync, rename,
// exchange, sync_dir, make_dirs and remove_all) throws as if the system returned `error` (e.g. EIO,
// ENOSPC).
class FaultyFileSystem final : public FileSystem {
 public:
  explicit FaultyFileSystem(FileSystem& base) : base_(base) {}

  void fail_at(long op, int error) { fail_at_ = op, error_ = error; }
  // The process "dies" at the `op`-th operation: it and every later one throw EIO, so nothing after
  // it reaches the file system (with PowerLossFileSystem below: a crash, then a power loss).
  void crash_at(long op) { fail_at_ = op, error_ = EIO, crash_ = true; }
  long operations() const { return ops_; }  // operations counted so far
  bool failed() const { return failed_; }

  std::unique_ptr<WritableFile> create(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void exchange(const std::string& a, const std::string& b) override;
  void sync_dir(const std::string& dir) override;
  void make_dirs(const std::string& dir) override;
  void remove_all(const std::string& path) override;

  // Counts one operation and throws when it is the one chosen to fail.
  void tick(const char* op, const std::string& path);

 private:
  FileSystem& base_;
  long ops_ = 0;
  long fail_at_ = 0;
  int error_ = 0;
  bool failed_ = false;
  bool crash_ = false;
};

// A FileSystem that forwards to another and remembers what is not yet on stable storage, so that a
// test can lose it as a power failure would (power_loss()):
//  - a file's data appended after its last sync();
//  - a directory entry — a file created, a rename, an exchange, a directory made, a removal — until
//    sync_dir() of the directory holding it.
// power_loss() undoes those entries, newest first (a created file disappears, a rename goes back
// and restores what it replaced, a removed tree comes back), then cuts every file written through
// this object back to its synced length. Files that existed before count as durable. Removed trees
// and replaced files are kept aside in `<root>.trash/` until their removal is durable.
class PowerLossFileSystem final : public FileSystem {
 public:
  PowerLossFileSystem(FileSystem& base, std::string root);
  ~PowerLossFileSystem() override;

  std::unique_ptr<WritableFile> create(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void exchange(const std::string& a, const std::string& b) override;
  void sync_dir(const std::string& dir) override;
  void make_dirs(const std::string& dir) override;
  void remove_all(const std::string& path) override;

  // The machine loses power: everything not durable is lost (see above).
  void power_loss();

  // For the files of this object: their data's synced length, by inode.
  void note_written(const std::string& path, int64_t bytes);
  void note_synced(const std::string& path);

 private:
  struct Op {
    enum class Kind { create, rename, exchange, mkdir, remove } kind;
    std::string dir;  // the directory whose fsync makes it durable
    std::string a, b, aside;
    bool durable = false;
  };
  std::string aside_path();

  FileSystem& base_;
  std::string root_, trash_;
  std::vector<Op> ops_;
  struct Data {
    int64_t size = 0, synced = 0;
  };
  std::map<uint64_t, Data> data_;  // by inode
  long next_aside_ = 0;
};

// Writes `contents` to `path` atomically: a new temporary `<path>.tmp.<random>`, fsync, rename over
// `path`, fsync the directory. Readers see the old file or the new one, never a mix; a link at
// `path` is replaced, never written through.
void write_file_atomic(FileSystem& fs, const std::string& path, std::string_view contents);

// Temporary files and directories in places other users may write to (a shared run or output
// directory): names they cannot predict, created exclusively, never through a link. Every writer of
// a temporary uses these.
//
// `hex_digits` random lowercase hex digits (getrandom(2)).
std::string random_name_suffix(int hex_digits = 16);
// Creates a new file `<base>.tmp.<random>` for writing (O_CREAT | O_EXCL | O_NOFOLLOW), trying
// another name while one is taken; returns its descriptor (the caller closes it) and its path in
// *path. Throws llmtrain::Error naming the directory when it cannot.
int create_temp_file(const std::string& base, std::string* path, unsigned mode = 0644);
// Creates a new directory `<base>.<random>` (mode 0700, mkdtemp(3)) and returns its path.
std::string make_temp_dir(const std::string& base);
// Opens `path` for appending, creating it (0644) when missing, never through a symbolic link at
// `path` (O_NOFOLLOW): run logs and metrics. Returns nullptr with errno set when it cannot.
std::FILE* open_append(const std::string& path);

// Reads a whole regular file of at most `max_bytes`; throws llmtrain::Error naming the path when it
// cannot be read, is not a regular file (a FIFO would block, /dev/zero never end) or is larger.
// Every file we read may be hostile: the default bound is far above any manifest, tokenizer or
// recipe we write or read, and far below what would exhaust memory.
inline constexpr int64_t kReadFileLimit = int64_t(1) << 30;
std::string read_file(const std::string& path, int64_t max_bytes = kReadFileLimit);

}  // namespace llmtrain
