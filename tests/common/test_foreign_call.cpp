// The foreign-call check template: a failing call becomes an environment Error naming the
// library, the call as written, the code and its text, the rank and file:line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/foreign_call.h"
#include "common/log.h"

namespace llmtrain {
namespace {

enum FakeStatus { kFakeOk = 0, kFakeBroken = 7 };
const char* fake_text(FakeStatus s) { return s == kFakeBroken ? "the fake device is broken" : "ok"; }
FakeStatus fake_call(int x) { return x > 0 ? kFakeBroken : kFakeOk; }

#define LT_FAKE(call) LT_FOREIGN_CHECK("FakeLib", call, kFakeOk, fake_text)

TEST(ForeignCall, SuccessIsSilent) {
  int calls = 0;
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(LT_FAKE((++calls, fake_call(0))));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(calls, 1);  // made once: not again for a message
}

TEST(ForeignCall, FailureNamesCallTextRankAndPlace) {
  log_set_rank(3, 4);
  try {
    LT_FAKE(fake_call(1 + 1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, ::testing::HasSubstr("FakeLib call failed on rank 3: fake_call(1 + 1) returned 7"));
    EXPECT_THAT(what, ::testing::HasSubstr("(the fake device is broken)"));
    EXPECT_THAT(what, ::testing::HasSubstr("at tests/common/test_foreign_call.cpp:"));
    EXPECT_EQ(e.kind(), Error::Kind::environment);
    EXPECT_EQ(e.exit_code(), kExitFailure);
  }
  log_set_rank(0, 1);
}

TEST(ForeignCall, SourcePathIsRelativeToTheTree) {
  EXPECT_STREQ(source_path(LLMTRAIN_SOURCE_DIR "/tests/parallel/a.cpp"), "tests/parallel/a.cpp");
  EXPECT_STREQ(source_path("/elsewhere/b.cpp"), "/elsewhere/b.cpp");
}

}  // namespace
}  // namespace llmtrain
