// The job's output, sorted by rank: the launcher program's stdout/stderr come in tagged by rank
// (mpirun --tag-output: "[1,3]<stdout>:text"; srun --label: "3: text"), and go out
//  - to the console as "[rank 3] text" (stdout to stdout, stderr to stderr),
//  - to <log.dir>/logs/rank_00003.log, one file per rank, appended across restarts with a header
//    line per attempt,
//  - and, for lines of the launcher program itself (mpirun's and srun's own messages) and of the
//    supervisor, to <log.dir>/logs/launcher.log with a timestamp.
//
// Rule a reader could get wrong: a rank that already prefixes its lines with "[rank N] " (llmtrain's
// own logging does, parallel/bootstrap.h) is not prefixed twice on the console; its log file holds
// the lines without any prefix.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::launcher {

enum class OutputTags { mpirun_tag_output, srun_label };

struct TaggedLine {
  int rank = -1;  // -1: a line of the launcher program itself
  bool is_stderr = false;
  std::string text;
};

// One line (without its newline) read from the launcher program's stdout or stderr.
TaggedLine parse_tagged_line(OutputTags tags, std::string_view line, bool from_stderr);

// "rank_00003.log"
std::string rank_log_name(int rank);

class RankOutput {
 public:
  // `logs_dir` is created when missing; "" keeps no files. `console` false: files only.
  RankOutput(std::string logs_dir, OutputTags tags, bool console = true);
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;
  ~RankOutput();

  // Starts a new attempt: every rank file gets `header` before its next line. With `ranks` > 0,
  // the files of ranks 0..ranks-1 get it now, so every rank of the job has a log that shows each
  // attempt, also a rank that prints nothing (llmtrain's ranks other than 0, on a healthy run).
  void begin_attempt(const std::string& header, int ranks = 0);
  // Bytes read from the launcher program's stdout (is_stderr false) or stderr.
  void feed(bool is_stderr, std::string_view bytes);
  // Emits a partial last line of either stream.
  void flush();
  // Progress reports of the ranks (parallel/progress.h): a line holding the marker goes to `sink`
  // (the rank and the text after the marker), not to the console or the logs; text before the
  // marker on the same line is output as usual.
  void set_progress_sink(std::function<void(int rank, std::string_view report)> sink) { sink_ = std::move(sink); }
  // A stop was asked for (SIGTERM/SIGINT relayed to the ranks): mpirun's banners about ranks that
  // exited non-zero ("Primary job terminated normally, but 1 process returned a non-zero exit
  // code...", "mpirun detected that one or more processes exited with non-zero status...") say only
  // that the ranks exited 75 as asked; they go to launcher.log, not the console. Other messages of
  // the launcher program are shown as always.
  void set_stopping(bool stopping) { stopping_ = stopping; }
  // A message of the supervisor: "[launcher] text" on stderr (with the console on) and in launcher.log.
  void launcher_message(const std::string& text);
  const std::string& launcher_log_path() const { return launcher_log_path_; }

 private:
  void emit(const TaggedLine& line);
  void emit_launcher_line(const std::string& text, bool is_stderr);
  void end_banner();
  std::FILE* rank_file(int rank);
  void launcher_log(const std::string& text);

  std::string logs_dir_;
  std::string launcher_log_path_;
  OutputTags tags_;
  bool console_;
  std::string pending_[2];  // partial lines of stdout, stderr
  std::map<int, std::FILE*> rank_files_;
  std::map<int, int> header_seen_;  // rank -> attempt whose header its file has
  std::FILE* launcher_file_ = nullptr;
  std::string header_;
  int attempt_ = 0;
  std::function<void(int, std::string_view)> sink_;
  bool stopping_ = false;
  // The launcher program's message box being read ("-----" ... "-----"), held until it closes.
  std::vector<TaggedLine> banner_;
  bool in_banner_ = false;
};

}  // namespace llmtrain::launcher
