#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher/rank_output.h"

using namespace llmtrain::launcher;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(RankOutput, ParsesMpirunTags) {
  TaggedLine l = parse_tagged_line(OutputTags::mpirun_tag_output, "[1,13]<stdout>:step 3: loss 2.5", false);
  EXPECT_EQ(l.rank, 13);
  EXPECT_FALSE(l.is_stderr);
  EXPECT_EQ(l.text, "step 3: loss 2.5");
  l = parse_tagged_line(OutputTags::mpirun_tag_output, "[1,0]<stderr>:[rank 0] error: x", false);
  EXPECT_EQ(l.rank, 0);
  EXPECT_TRUE(l.is_stderr);
  EXPECT_EQ(l.text, "[rank 0] error: x");
  l = parse_tagged_line(OutputTags::mpirun_tag_output, "[1,2]<stdout>:", false);
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.text, "");
  // mpirun's own messages are not tagged.
  l = parse_tagged_line(OutputTags::mpirun_tag_output, "mpirun noticed that process rank 2 ...", true);
  EXPECT_EQ(l.rank, -1);
  EXPECT_TRUE(l.is_stderr);
  l = parse_tagged_line(OutputTags::mpirun_tag_output, "[vm:01234] *** Process received signal ***", true);
  EXPECT_EQ(l.rank, -1);
}

TEST(RankOutput, ParsesSrunLabels) {
  TaggedLine l = parse_tagged_line(OutputTags::srun_label, "3: hello", false);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.text, "hello");
  l = parse_tagged_line(OutputTags::srun_label, " 7: padded to the widest label", true);
  EXPECT_EQ(l.rank, 7);
  EXPECT_TRUE(l.is_stderr);
  EXPECT_EQ(l.text, "padded to the widest label");
  l = parse_tagged_line(OutputTags::srun_label, "srun: error: vm: tasks 0-3: Exited with exit code 75", true);
  EXPECT_EQ(l.rank, -1);
  l = parse_tagged_line(OutputTags::srun_label, "0: slurmstepd-vm: error: *** STEP 1.0 CANCELLED ***", true);
  EXPECT_EQ(l.rank, -1);  // slurmstepd's note, not rank 0's output
}

TEST(RankOutput, ProgressReportsGoToTheSinkNotTheLogs) {
  std::string dir = ::testing::TempDir() + "rank_progress_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::vector<std::pair<int, std::string>> reports;
  {
    RankOutput out(dir, OutputTags::mpirun_tag_output, /*console=*/false);
    out.set_progress_sink([&](int rank, std::string_view r) { reports.emplace_back(rank, std::string(r)); });
    out.begin_attempt("attempt 1 of 1");
    out.feed(false, "[1,0]<stdout>:@@llmtrain-progress step=3 phase=train\n");
    // A report that landed inside a line of the rank's own output: the text before it stays output.
    out.feed(false, "[1,1]<stdout>:step 4 @@llmtrain-progress step=4 phase=save op=all_reduce #9 on group 'dp'\n");
    out.feed(false, "[1,1]<stdout>:plain\n");
  }
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0], (std::pair<int, std::string>{0, "step=3 phase=train"}));
  EXPECT_EQ(reports[1], (std::pair<int, std::string>{1, "step=4 phase=save op=all_reduce #9 on group 'dp'"}));
  std::string r0 = slurp(dir + "/rank_00000.log");
  std::string r1 = slurp(dir + "/rank_00001.log");
  EXPECT_EQ(r0.find("llmtrain-progress"), std::string::npos) << r0;
  EXPECT_NE(r1.find("---\nstep 4 \nplain\n"), std::string::npos) << r1;
  std::filesystem::remove_all(dir);
}

TEST(RankOutput, WritesOneFilePerRankAcrossAttemptsAndPartialLines) {
  std::string dir = ::testing::TempDir() + "rank_output_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  {
    RankOutput out(dir, OutputTags::mpirun_tag_output, /*console=*/false);
    out.begin_attempt("attempt 1 of 2");
    out.feed(false, "[1,0]<stdout>:first li");
    out.feed(false, "ne\n[1,1]<stdout>:[rank 1] own prefix\nplain mpirun line\n");
    out.feed(true, "[1,1]<stderr>:an error\n[1,0]<stdout>:no newline at the end");
    out.flush();
    out.begin_attempt("attempt 2 of 2, resuming from ckpt/step_00000004");
    out.feed(false, "[1,1]<stdout>:again\n");
    out.launcher_message("the job finished (exit 0)");
  }
  std::string r0 = slurp(dir + "/rank_00000.log");
  std::string r1 = slurp(dir + "/rank_00001.log");
  std::string launcher = slurp(dir + "/launcher.log");
  EXPECT_NE(r0.find("attempt 1 of 2 ---\nfirst line\nno newline at the end\n"), std::string::npos) << r0;
  EXPECT_EQ(r0.find("attempt 2"), std::string::npos) << r0;  // rank 0 said nothing in attempt 2
  EXPECT_NE(r1.find("attempt 1 of 2 ---\nown prefix\nan error\n--- "), std::string::npos) << r1;
  EXPECT_NE(r1.find("attempt 2 of 2, resuming from ckpt/step_00000004 ---\nagain\n"), std::string::npos) << r1;
  EXPECT_NE(launcher.find("plain mpirun line"), std::string::npos) << launcher;
  EXPECT_NE(launcher.find("the job finished (exit 0)"), std::string::npos) << launcher;
  EXPECT_EQ(rank_log_name(12345), "rank_12345.log");
  std::filesystem::remove_all(dir);
}

TEST(RankOutput, EveryRankOfTheJobGetsALogWithEachAttempt) {
  // llmtrain's ranks other than 0 print nothing on a healthy run: their logs must still exist and
  // show each attempt they took part in.
  std::string dir = ::testing::TempDir() + "rank_output_all_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  {
    RankOutput out(dir, OutputTags::srun_label, /*console=*/false);
    out.begin_attempt("attempt 1 of 2", 3);
    out.feed(false, "0: step 1\n");
    out.begin_attempt("attempt 2 of 2, resuming from ckpt/step_00000004", 3);
  }
  std::string r0 = slurp(dir + "/rank_00000.log");
  std::string r2 = slurp(dir + "/rank_00002.log");
  EXPECT_NE(r0.find("attempt 1 of 2 ---\nstep 1\n--- "), std::string::npos) << r0;
  EXPECT_NE(r2.find("attempt 1 of 2 ---\n--- "), std::string::npos) << r2;
  EXPECT_NE(r2.find("attempt 2 of 2, resuming from ckpt/step_00000004 ---\n"), std::string::npos) << r2;
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank_00003.log"));
  std::filesystem::remove_all(dir);
}

// While stopping (a relayed SIGTERM/SIGINT), mpirun's boxes saying only that ranks exited non-zero
// stay off the console (they are in launcher.log); another box, or the same box on a job that was
// not asked to stop, is shown whole.
TEST(RankOutput, ExitBannersAreKeptOffTheConsoleWhileStopping) {
  const std::string dashes(74, '-');
  const std::string banner = dashes +
                             "\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code. " +
                             "Per user-direction, the job has been aborted.\n" + dashes + "\n";
  const std::string other = dashes + "\nThere are not enough slots available in the system\n" + dashes + "\n";
  for (bool stopping : {false, true}) {
    const std::string dir =
        ::testing::TempDir() + "/rank_output_banner_" + std::to_string(::getpid()) + (stopping ? "_stop" : "_run");
    std::filesystem::remove_all(dir);
    ::testing::internal::CaptureStderr();
    {
      RankOutput out(dir, OutputTags::mpirun_tag_output);
      out.set_stopping(stopping);
      out.feed(true, banner + "[1,0]<stderr>:[rank 0] interrupted\n" + other);
    }
    const std::string console = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(console.find("Primary job") == std::string::npos, stopping) << console;
    EXPECT_NE(console.find("not enough slots"), std::string::npos) << console;
    EXPECT_NE(console.find("[rank 0] interrupted"), std::string::npos) << console;
    EXPECT_NE(slurp(dir + "/launcher.log").find("Primary job  terminated normally"), std::string::npos);
    std::filesystem::remove_all(dir);
  }
}
