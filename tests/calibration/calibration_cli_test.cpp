// planc explain reproduces paraplan_calibrate's prediction for a calibration row written as a
// plan (`framework = ...` selects the same profile; there is no separate calibration mode).
// Without the shared calibration runs beside the repository the comparison is skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "tests/support/cli.h"

namespace {

using Result = paraplan::testing::CommandResult;

std::string Dir() {
  static const std::string kDir = paraplan::testing::ScratchDir("calibration");
  return kDir;
}

Result Run(const std::string& command) { return paraplan::testing::RunCommand(command, Dir()); }

// Tokens/s per GPU from planc explain's "throughput X tokens/s per GPU" line; -1 when absent.
double ExplainThroughput(const std::string& out) {
  const size_t at = out.find("throughput ");
  double v = -1;
  if (at == std::string::npos ||
      std::sscanf(out.c_str() + at, "throughput %lf tokens/s per GPU", &v) != 1)
    return -1;
  return v;
}

// The predicted tokens/s per GPU of run `id` in paraplan_calibrate --csv; -1 when absent.
double CalibratePrediction(const std::string& csv, const std::string& id) {
  std::istringstream lines(csv);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(id + ",", 0) != 0) continue;
    // id,source,profile,measured,predicted,...
    std::istringstream fields(line);
    std::string field;
    for (int i = 0; i < 5 && std::getline(fields, field, ','); ++i) {
    }
    return std::stod(field);
  }
  return -1;
}

TEST_CASE(
    "planc explain on a plan written for a calibration row gives paraplan_calibrate's number") {
  const Result cal = Run(PARAPLAN_CALIBRATE " --csv");
  REQUIRE_MESSAGE(cal.status == 0, cal.err);
  if (cal.out.empty()) {
    MESSAGE("no shared calibration runs beside the repository: " << cal.err);
    return;
  }
  const std::string root = PARAPLAN_SOURCE_DIR "/tests/calibration/plans/";
  const std::pair<const char*, const char*> rows[] = {
      {"korthikanti22_t5_22b_sp_selective.plan", "korthikanti22-t5-22b-sp-selective"},
      {"nemo2407_llama2_7b_fp8.plan", "nemo2407-h100-fp8-llama2-7b-8gpu"},
      {"torchtitan2412_llama3_70b_asynctp.plan", "torchtitan-2412-t4-70b-fsdp32-tp8-asynctp"},
  };
  for (const auto& row : rows) {
    const char* file = row.first;  // not a structured binding: INFO captures it
    const char* id = row.second;
    INFO(file);
    const Result explain = Run(std::string(PARAPLAN_PLANC) + " explain " + root + file);
    REQUIRE_MESSAGE(explain.status == 0, explain.err);
    const double planc = ExplainThroughput(explain.out);
    const double calibrate = CalibratePrediction(cal.out, id);
    REQUIRE(planc > 0);
    REQUIRE(calibrate > 0);
    CHECK(std::fabs(planc / calibrate - 1) < 1e-3);
  }
}

TEST_CASE(
    "the calibration tool refuses unknown options and reads a missing file as nothing to compare") {
  Result r = Run(PARAPLAN_CALIBRATE " --bogus");
  CHECK(r.status == 2);
  CHECK(r.err.find("unknown option --bogus") != std::string::npos);
  r = Run(PARAPLAN_CALIBRATE " " + Dir() + "/no_such_runs.json");
  CHECK(r.status == 0);
  CHECK(r.err.find("nothing to compare") != std::string::npos);
  CHECK(r.out.empty());
}

}  // namespace
