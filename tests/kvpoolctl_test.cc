// kvpoolctl against a master and a separate segment daemon: what an operator types.

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/harness/cluster.h"

namespace kvpool {
namespace {

struct CtlRun {
  int exit_code = -1;
  std::string first_line;
};

class KvpoolctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MasterProcess> master =
        testing::StartMaster({"--embedded-segment-size=0"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    absl::StatusOr<testing::SegmentProcess> segment = testing::StartSegment(master_.grpc, "64MiB");
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
    dir_ = ::testing::TempDir();
  }

  // Runs kvpoolctl with --master and `args`; returns its exit code and first stdout line.
  CtlRun Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), "--master=" + master_.grpc);
    std::unique_ptr<testing::Process> process = *testing::Process::Start(testing::CtlBinary(), args);
    CtlRun run;
    run.first_line = process->WaitForLine("", absl::Seconds(20)).value_or("");
    int status = process->Wait();
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return run;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    std::ostringstream data;
    data << file.rdbuf();
    return data.str();
  }

  testing::MasterProcess master_;
  testing::SegmentProcess segment_;
  std::string dir_;
};

TEST_F(KvpoolctlTest, PutThenGetThroughASegmentDaemonReturnsIdenticalBytes) {
  std::string in = dir_ + "/kvpoolctl_in.bin";
  std::string out = dir_ + "/kvpoolctl_out.bin";
  std::string value(5 << 20, '\0');
  std::mt19937 rng(5);
  for (char& c : value) c = static_cast<char>(rng());
  std::ofstream(in, std::ios::binary).write(value.data(), static_cast<std::streamsize>(value.size()));

  CtlRun put = Ctl({"put", "model@tp_rank:0@pcp0@dcp0@pp_rank:0@00ff", in});
  EXPECT_EQ(put.exit_code, 0);
  EXPECT_EQ(put.first_line, "stored model@tp_rank:0@pcp0@dcp0@pp_rank:0@00ff (5.00 MiB)");
  CtlRun get = Ctl({"get", "model@tp_rank:0@pcp0@dcp0@pp_rank:0@00ff", out});
  EXPECT_EQ(get.exit_code, 0);
  EXPECT_TRUE(ReadFile(out) == value) << "bytes differ";

  CtlRun status = Ctl({"--json", "status"});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_NE(status.first_line.find("\"objects\":1"), std::string::npos) << status.first_line;
  EXPECT_NE(status.first_line.find("\"used_bytes\":5242880"), std::string::npos);
  EXPECT_NE(status.first_line.find("\"name\":\"" + segment_.name + "\""), std::string::npos);

  CtlRun segments = Ctl({"segments"});
  EXPECT_EQ(segments.exit_code, 0);
  EXPECT_EQ(segments.first_line.rfind("SEGMENT", 0), 0u) << segments.first_line;
}

TEST_F(KvpoolctlTest, ExistsRmAndErrorsHaveExitCodes) {
  std::string in = dir_ + "/kvpoolctl_small.bin";
  std::ofstream(in) << "hello";
  ASSERT_EQ(Ctl({"put", "k", in}).exit_code, 0);
  CtlRun exists = Ctl({"--json", "exists", "k", "missing"});
  EXPECT_EQ(exists.exit_code, 0);
  EXPECT_EQ(exists.first_line, "{\"k\":true,\"missing\":false}");

  CtlRun again = Ctl({"--json", "put", "k", in});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.first_line.find("\"code\":-705"), std::string::npos) << again.first_line;

  CtlRun leased = Ctl({"--json", "rm", "k"});  // exists leased it
  EXPECT_EQ(leased.exit_code, 1);
  EXPECT_EQ(leased.first_line, "{\"k\":-706}");
  EXPECT_EQ(Ctl({"rm", "--force", "k"}).exit_code, 0);
  CtlRun gone = Ctl({"--json", "get", "k", dir_ + "/never"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_NE(gone.first_line.find("OBJECT_NOT_FOUND"), std::string::npos) << gone.first_line;

  EXPECT_EQ(Ctl({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Ctl({"put", "only-a-key"}).exit_code, 2);
}

TEST_F(KvpoolctlTest, DrainMovesTheSegmentsObjectsToAnotherAndItExits) {
  std::string in = dir_ + "/kvpoolctl_drain.bin";
  std::string value(3 << 20, 'x');
  value[12345] = 'y';
  std::ofstream(in, std::ios::binary).write(value.data(), static_cast<std::streamsize>(value.size()));
  ASSERT_EQ(Ctl({"put", "a", in}).exit_code, 0);
  ASSERT_EQ(Ctl({"put", "b", in}).exit_code, 0);
  absl::StatusOr<testing::SegmentProcess> other = testing::StartSegment(master_.grpc, "64MiB");
  ASSERT_TRUE(other.ok()) << other.status();

  CtlRun drain = Ctl({"--json", "drain", segment_.name});
  EXPECT_EQ(drain.exit_code, 0);
  EXPECT_EQ(drain.first_line, "{\"ok\":true,\"segment\":\"" + segment_.name +
                                  "\",\"moved_objects\":2,\"moved_bytes\":6291456,"
                                  "\"failed_copies\":0,\"unplaceable\":0}");
  int wait_status = segment_.process->Wait();
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  std::string out = dir_ + "/kvpoolctl_drained.bin";
  EXPECT_EQ(Ctl({"get", "b", out}).exit_code, 0);
  EXPECT_TRUE(ReadFile(out) == value) << "bytes differ after the move";
  EXPECT_EQ(Ctl({"drain", "no-such-segment"}).exit_code, 1);
  EXPECT_EQ(Ctl({"drain"}).exit_code, 2);
}

TEST_F(KvpoolctlTest, UnreachableMasterIsAClearRpcFailure) {
  std::unique_ptr<testing::Process> process = *testing::Process::Start(
      testing::CtlBinary(), {"--master=127.0.0.1:1", "--timeout=1s", "--json", "status"});
  std::string line = process->WaitForLine("", absl::Seconds(20)).value_or("");
  int status = process->Wait();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(line.find("\"code\":-900"), std::string::npos) << line;
}

}  // namespace
}  // namespace kvpool
