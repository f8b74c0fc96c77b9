// The table of GPU architectures (engine/backends/cuda/architectures.h): which row a device runs, that the rows are
// what the inferd-all build compiles for, and how the code a device runs is described.
#include "engine/backends/cuda/architectures.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/strings/str_split.h"

namespace inferd {
namespace {

int RowOf(int cc) {
  const GpuArchitecture* a = ArchitectureFor(cc);
  return a ? a->compute_capability : 0;
}

TEST(GpuArchitectures, ADeviceRunsTheNewestRowOfItsMajorVersionAtOrBelowIt) {
  EXPECT_EQ(RowOf(80), 80);
  EXPECT_EQ(RowOf(86), 86);
  EXPECT_EQ(RowOf(87), 86);  // Jetson Orin runs the 8.6 code
  EXPECT_EQ(RowOf(89), 89);
  EXPECT_EQ(RowOf(90), 90);
  EXPECT_EQ(RowOf(100), 100);
  EXPECT_EQ(RowOf(103), 100);
  EXPECT_EQ(RowOf(120), 120);
  EXPECT_EQ(RowOf(121), 120);
  EXPECT_EQ(RowOf(75), 0);   // Turing: none
  EXPECT_EQ(RowOf(110), 0);  // no 11.x code is built, and 12.0's PTX does not run there
}

TEST(GpuArchitectures, FeaturesFollowTheHardware) {
  EXPECT_FALSE(ArchitectureFor(80)->fp8);
  EXPECT_FALSE(ArchitectureFor(86)->fp8);
  EXPECT_TRUE(ArchitectureFor(89)->fp8);
  EXPECT_FALSE(ArchitectureFor(89)->dependent_launch);
  EXPECT_TRUE(ArchitectureFor(90)->dependent_launch);
  EXPECT_TRUE(ArchitectureFor(120)->fp8);
}

// Every row is built as machine code by `-DCMAKE_CUDA_ARCHITECTURES=inferd-all`, and that build carries nothing
// the table does not describe (bar the PTX of its newest row, for GPUs after it).
TEST(GpuArchitectures, TheRowsAreWhatTheAllGpuBuildCompiles) {
  std::set<std::string> built, rows;
  for (absl::string_view e : absl::StrSplit(INFERD_ALL_CUDA_ARCHITECTURES, ',')) built.insert(std::string(e));
  for (const GpuArchitecture& a : GpuArchitectures()) rows.insert(std::string(a.code) + "-real");
  const std::string newest = std::string(GpuArchitectures().back().code);
  rows.insert(newest + "-virtual");
  EXPECT_EQ(built, rows);
  EXPECT_NE(GpuArchitectureList().find("9.0 (Hopper"), std::string::npos) << GpuArchitectureList();
}

TEST(GpuArchitectures, TheCodeADeviceRunsIsNamed) {
  EXPECT_EQ(DescribeDeviceCode("90a", 90, 90), "sm_90a code from this build");
  EXPECT_EQ(DescribeDeviceCode("80-real,86-real,90a-real,120-virtual", 86, 86), "sm_86 code from this build");
  // An 8.9 GPU with only 8.0 machine code runs that code.
  EXPECT_EQ(DescribeDeviceCode("80-real", 80, 80), "sm_80 code from this build");
  EXPECT_EQ(DescribeDeviceCode("80-virtual", 80, 90),
            "compute_80 PTX compiled by the driver at first use (this build carries 80-virtual)");
  EXPECT_EQ(DescribeDeviceCode("90a-real;120-virtual", 120, 121).rfind("compute_120 PTX", 0), 0u);
}

}  // namespace
}  // namespace inferd
