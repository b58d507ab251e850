#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "launcher/hostfile.h"

using namespace llmtrain;
using namespace llmtrain::launcher;
using ::testing::HasSubstr;

namespace {

std::string error_of(std::string_view text) {
  try {
    hostfile_parse(text, "hosts.txt");
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "no error";
}

}  // namespace

TEST(Hostfile, ParsesHostsSlotsAndComments) {
  Hostfile hf =
      hostfile_parse("# cluster\nnode1 slots=4\n\n  node2   slots=2 max_slots=8  # comment\nnode3\n", "hosts.txt");
  ASSERT_EQ(hf.hosts.size(), 3u);
  EXPECT_EQ(hf.hosts[0].host, "node1");
  EXPECT_EQ(hf.hosts[0].slots, 4);
  EXPECT_EQ(hf.hosts[0].line, 2);
  EXPECT_EQ(hf.hosts[1].host, "node2");
  EXPECT_EQ(hf.hosts[1].slots, 2);
  EXPECT_EQ(hf.hosts[1].line, 4);
  EXPECT_EQ(hf.hosts[2].slots, 0);  // not given
}

TEST(Hostfile, MaxSlotsAloneBoundsTheHost) {
  Hostfile hf = hostfile_parse("a max-slots=3\n", "h");
  EXPECT_EQ(hf.hosts[0].slots, 3);
}

TEST(Hostfile, ErrorsNameFileLineAndToken) {
  EXPECT_THAT(error_of("a slots=2\nb slot=2\n"), HasSubstr("hosts.txt:2: unknown field 'slot=2' for host b"));
  EXPECT_THAT(error_of("a slots=two\n"), HasSubstr("hosts.txt:1: slots must be a positive integer, found 'two'"));
  EXPECT_THAT(error_of("a slots=0\n"), HasSubstr("hosts.txt:1: slots must be a positive integer, found '0'"));
  EXPECT_THAT(error_of("slots=2\n"), HasSubstr("hosts.txt:1: expected a host name first, found 'slots=2'"));
  EXPECT_THAT(error_of("a slots=4 max_slots=2\n"), HasSubstr("host a has slots=4 above max_slots=2"));
  EXPECT_THAT(error_of("a\nb\na slots=2\n"), HasSubstr("hosts.txt:3: host a is listed twice (lines 1 and 3)"));
  EXPECT_THAT(error_of("# nothing\n\n"), HasSubstr("hosts.txt: the hostfile lists no hosts"));
  EXPECT_THAT(error_of("a slots=x\n"), HasSubstr("host [slots=N] [max_slots=N]"));
}

TEST(Hostfile, HostsThatSshOrAShellWouldMisreadAreRefused) {
  // A host beginning with '-' would reach the pre-flight `ssh` as an option (-F names a config with
  // a ProxyCommand: a command run here); quotes, `;` and `$` are shell syntax in mpirun's remote command.
  for (const char* bad : {"-Fevil.conf", "-oProxyCommand", "a;reboot", "a$(id)", "'a'", "a/b", "@a", "-user@a",
                          "user@-a", ".a", "a\x01"}) {
    EXPECT_THAT(error_of(std::string(bad) + " slots=1\n"), HasSubstr("is not a host name")) << bad;
  }
  EXPECT_THAT(error_of("a\x01"
                       "b\n"),
              HasSubstr("'a\\x01b' is not a host name"));
  Hostfile hf = hostfile_parse("node-1.cluster.local\n10.0.0.7 slots=2\nfe80::1\nalice@gpu_3\n", "hosts.txt");
  ASSERT_EQ(hf.hosts.size(), 4u);
  EXPECT_EQ(hf.hosts[3].host, "alice@gpu_3");
}

TEST(Hostfile, OnlyRegularFilesOfBoundedSizeAreRead) {
  try {
    hostfile_read("/dev/zero");  // would never end
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a regular file"));
  }
}

TEST(Hostfile, UnreadableFileSaysWhy) {
  try {
    hostfile_read("/nonexistent/hosts.txt");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("launch.hostfile: cannot read /nonexistent/hosts.txt: No such file or directory"));
  }
}
