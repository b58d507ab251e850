// The CPU peak MFU is measured against (kernels/cpu/cpu_peak.cpp): the table, the arithmetic, the
// choice of clock and of the measured fallback, and the parsing of /proc/cpuinfo and cpufreq text,
// all from given inputs; then one reading of this machine.
#include <gtest/gtest.h>

#include "common/host.h"
#include "kernels/backend_info.h"

namespace llmtrain::kernels {
namespace {

// A 2-core Zen 4 VM as the report's: no cpufreq, no cpuid 0x16, "AMD EPYC" without a clock.
CpuFacts zen4_vm() {
  CpuFacts f;
  f.vendor = "AuthenticAMD";
  f.family = 25;
  f.model = 17;
  f.model_name = "AMD EPYC";
  f.cpuinfo_mhz = 2596.13;
  f.measured_mhz = 3700;
  f.threads = 2;
  f.blas_core = "Haswell";
  f.avx512 = true;
  return f;
}

CpuFacts xeon(std::string name, int threads, bool avx512, std::string blas_core) {
  CpuFacts f;
  f.vendor = "GenuineIntel";
  f.family = 6;
  f.model = 0x55;
  f.model_name = std::move(name);
  f.name_mhz = model_name_mhz(f.model_name);
  f.cpufreq_max_mhz = 3700;
  f.threads = threads;
  f.avx512 = avx512;
  f.blas_core = std::move(blas_core);
  return f;
}

TEST(CpuPeak, TableKnowsTheFamilies) {
  struct Case {
    const char* vendor;
    int family, model;
    const char* name;
    const char* row;
    int fma256, fma512;
  };
  const Case cases[] = {
      {"AuthenticAMD", 0x17, 0x01, "AMD EPYC 7601", "AMD Zen/Zen+", 1, 0},
      {"HygonGenuine", 0x18, 0x00, "Hygon C86 7185", "Hygon Dhyana (Zen)", 1, 0},
      {"AuthenticAMD", 0x17, 0x31, "AMD EPYC 7742 64-Core Processor", "AMD Zen 2", 2, 0},
      {"AuthenticAMD", 0x17, 0x71, "AMD Ryzen 9 3950X", "AMD Zen 2", 2, 0},
      {"AuthenticAMD", 0x19, 0x01, "AMD EPYC 7B13", "AMD Zen 3", 2, 0},
      {"AuthenticAMD", 0x19, 0x21, "AMD Ryzen 9 5950X", "AMD Zen 3", 2, 0},
      {"AuthenticAMD", 0x19, 0x11, "AMD EPYC 9654", "AMD Zen 4", 2, 1},
      {"AuthenticAMD", 0x19, 0x61, "AMD Ryzen 9 7950X", "AMD Zen 4", 2, 1},
      {"AuthenticAMD", 0x19, 0xA0, "AMD EPYC 9754", "AMD Zen 4", 2, 1},
      {"AuthenticAMD", 0x1A, 0x02, "AMD EPYC 9755", "AMD Zen 5", 2, 2},
      {"GenuineIntel", 6, 0x3F, "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", "Intel Haswell", 2, 0},
      {"GenuineIntel", 6, 0x4F, "Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz", "Intel Broadwell", 2, 0},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Platinum 8180 CPU @ 2.50GHz",
       "Intel Skylake-SP/Cascade Lake, 2 AVX-512 FMA units", 2, 2},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz",
       "Intel Skylake-SP/Cascade Lake, 2 AVX-512 FMA units", 2, 2},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz",
       "Intel Skylake-SP/Cascade Lake, 1 AVX-512 FMA unit", 2, 1},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Gold 5122 CPU @ 3.60GHz",
       "Intel Skylake-SP/Cascade Lake, 2 AVX-512 FMA units", 2, 2},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Silver 4214R CPU @ 2.40GHz",
       "Intel Skylake-SP/Cascade Lake, 1 AVX-512 FMA unit", 2, 1},
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Bronze 3106 CPU @ 1.70GHz",
       "Intel Skylake-SP/Cascade Lake, 1 AVX-512 FMA unit", 2, 1},
      // Cooper Lake (x3xx) shares the model number; its Gold 5 parts are not the one-unit ones.
      {"GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Gold 5320H CPU @ 2.40GHz",
       "Intel Skylake-SP/Cascade Lake, 2 AVX-512 FMA units", 2, 2},
      {"GenuineIntel", 6, 0x6A, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "Intel Ice Lake-SP", 2, 2},
      {"GenuineIntel", 6, 0x7E, "Intel(R) Core(TM) i7-1065G7 CPU @ 1.30GHz", "Intel Ice Lake client", 2, 1},
      {"GenuineIntel", 6, 0x8F, "Intel(R) Xeon(R) Platinum 8480+", "Intel Sapphire Rapids", 2, 2},
      {"GenuineIntel", 6, 0x97, "12th Gen Intel(R) Core(TM) i9-12900K",
       "Intel hybrid (Alder Lake to Arrow Lake), P-core", 2, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::optional<CpuCoreSpec> spec = cpu_core_lookup(c.vendor, c.family, c.model, c.name);
    ASSERT_TRUE(spec.has_value());
    EXPECT_EQ(spec->name, c.row);
    EXPECT_EQ(spec->fma256, c.fma256);
    EXPECT_EQ(spec->fma512, c.fma512);
  }
}

TEST(CpuPeak, TableDoesNotGuessUnknownCpus) {
  EXPECT_FALSE(cpu_core_lookup("GenuineIntel", 6, 0x1C, "Intel(R) Atom(TM) CPU N270 @ 1.60GHz"));  // no AVX2
  EXPECT_FALSE(cpu_core_lookup("GenuineIntel", 19, 0x01, "a future Intel family"));
  EXPECT_FALSE(cpu_core_lookup("AuthenticAMD", 0x15, 0x02, "AMD Opteron(tm) Processor 6380"));
  EXPECT_FALSE(cpu_core_lookup("", -1, -1, ""));  // an ARM /proc/cpuinfo has no vendor_id
}

TEST(CpuPeak, OpenBlasCoreNamesGiveTheirVectorWidth) {
  EXPECT_EQ(blas_core_vector_bits("Haswell"), 256);
  EXPECT_EQ(blas_core_vector_bits("Zen"), 256);
  EXPECT_EQ(blas_core_vector_bits("SkylakeX"), 512);
  EXPECT_EQ(blas_core_vector_bits("COOPERLAKE"), 512);
  EXPECT_EQ(blas_core_vector_bits("SapphireRapids"), 512);
  EXPECT_EQ(blas_core_vector_bits("Prescott"), 128);
  EXPECT_EQ(blas_core_vector_bits(""), 128);
}

TEST(CpuPeak, ParsesProcCpuinfo) {
  const char* text =
      "processor\t: 0\n"
      "vendor_id\t: GenuineIntel\n"
      "cpu family\t: 6\n"
      "model\t\t: 85\n"
      "model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"
      "stepping\t: 4\n"
      "cpu MHz\t\t: 1000.012\n"
      "flags\t\t: fpu vme avx2 avx512f\n"
      "\n"
      "processor\t: 1\n"
      "vendor_id\t: GenuineIntel\n"
      "cpu family\t: 6\n"
      "model\t\t: 85\n"
      "model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"
      "cpu MHz\t\t: 3699.871\n";
  const CpuFacts f = cpuinfo_parse(text);
  EXPECT_EQ(f.vendor, "GenuineIntel");
  EXPECT_EQ(f.family, 6);
  EXPECT_EQ(f.model, 85);
  EXPECT_EQ(f.model_name, "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz");
  EXPECT_DOUBLE_EQ(f.cpuinfo_mhz, 3699.871);  // the highest core's, not the first's
  EXPECT_DOUBLE_EQ(f.name_mhz, 2400);

  const CpuFacts arm = cpuinfo_parse("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n");
  EXPECT_EQ(arm.vendor, "");
  EXPECT_EQ(arm.family, -1);
  EXPECT_EQ(arm.cpuinfo_mhz, 0);
  EXPECT_EQ(cpuinfo_parse("").model, -1);
}

TEST(CpuPeak, ParsesClockText) {
  EXPECT_DOUBLE_EQ(model_name_mhz("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"), 2400);
  EXPECT_DOUBLE_EQ(model_name_mhz("Some CPU @ 800MHz"), 800);
  EXPECT_EQ(model_name_mhz("AMD EPYC 7B13 64-Core Processor"), 0);
  EXPECT_EQ(model_name_mhz("broken @ fast"), 0);
  EXPECT_EQ(model_name_mhz("broken @ 2.4"), 0);  // no unit

  EXPECT_DOUBLE_EQ(cpufreq_khz_to_mhz("3700000\n"), 3700);
  EXPECT_DOUBLE_EQ(cpufreq_khz_to_mhz(" 2450000"), 2450);
  EXPECT_EQ(cpufreq_khz_to_mhz(""), 0);
  EXPECT_EQ(cpufreq_khz_to_mhz("<unknown>"), 0);
  EXPECT_EQ(cpufreq_khz_to_mhz("-1"), 0);
}

// The user's machine: cores × FLOPs per cycle × the clock, and the start-up line's wording.
TEST(CpuPeak, DerivesCoresTimesFlopsPerCycleTimesClock) {
  const CpuPeak p = cpu_peak_derive(zen4_vm());
  EXPECT_FALSE(p.measured);
  EXPECT_DOUBLE_EQ(p.flops, 2 * 32 * 3.7e9);  // 2 × 256-bit FMAs = 1 × 512-bit: 32 FLOP/cycle either way
  EXPECT_NE(p.how.find("2 cores × 32 FLOP/cycle × 3.7 GHz = 237 GFLOP/s"), std::string::npos) << p.how;
  EXPECT_NE(p.how.find("AMD Zen 4"), std::string::npos) << p.how;
  EXPECT_NE(p.how.find("AVX-512 attention, OpenBLAS Haswell at AVX2"), std::string::npos) << p.how;
  EXPECT_NE(p.how.find("measured 3.7, /proc/cpuinfo 2.6"), std::string::npos) << p.how;

  CpuFacts one = zen4_vm();
  one.threads = 1;
  EXPECT_DOUBLE_EQ(cpu_peak_derive(one).flops, 32 * 3.7e9);
  EXPECT_NE(cpu_peak_derive(one).how.find("1 core × "), std::string::npos);

  CpuFacts zen1 = zen4_vm();
  zen1.family = 0x17;
  zen1.model = 0x01;
  zen1.avx512 = false;
  EXPECT_DOUBLE_EQ(cpu_peak_derive(zen1).flops, 2 * 16 * 3.7e9);  // 128-bit FMA pipes
}

// The widest vector any kernel uses sets FLOPs per cycle, where the core has that width's units.
TEST(CpuPeak, VectorWidthIsTheWidestTheKernelsUse) {
  EXPECT_DOUBLE_EQ(cpu_peak_derive(xeon("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 20, true, "SkylakeX")).flops,
                   20 * 64 * 3.7e9);
  // Attention's AVX-512 alone counts too: its products may run at that rate.
  EXPECT_DOUBLE_EQ(cpu_peak_derive(xeon("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 20, true, "Haswell")).flops,
                   20 * 64 * 3.7e9);
  // No AVX-512 state from the OS (or a CPU without it): AVX2 everywhere.
  EXPECT_DOUBLE_EQ(cpu_peak_derive(xeon("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 20, false, "Haswell")).flops,
                   20 * 32 * 3.7e9);
  // One AVX-512 FMA unit: 16 lanes × 1 = 8 lanes × 2, no gain over AVX2.
  EXPECT_DOUBLE_EQ(cpu_peak_derive(xeon("Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz", 12, true, "SkylakeX")).flops,
                   12 * 32 * 3.7e9);
}

TEST(CpuPeak, TheHighestClockReadingWins) {
  CpuFacts f = zen4_vm();
  f.threads = 1;
  auto ghz = [&] { return cpu_peak_derive(f).flops / 32 / 1e9; };
  EXPECT_DOUBLE_EQ(ghz(), 3.7);  // measured beats a VM's nominal cpu MHz
  f.cpufreq_max_mhz = 2000;      // acpi-cpufreq without boost: below the measured clock
  EXPECT_DOUBLE_EQ(ghz(), 3.7);
  f.cpufreq_max_mhz = 4100;  // a real maximum above what one core reached now
  EXPECT_DOUBLE_EQ(ghz(), 4.1);
  EXPECT_NE(cpu_peak_derive(f).how.find("cpufreq max 4.1, measured 3.7, /proc/cpuinfo 2.6"), std::string::npos)
      << cpu_peak_derive(f).how;
  f = zen4_vm();
  f.threads = 1;
  f.measured_mhz = 0;  // not x86: no measurement
  f.cpuid_max_mhz = 3000;
  f.name_mhz = 2400;
  EXPECT_DOUBLE_EQ(ghz(), 3.0);
  f.cpuid_max_mhz = 0;
  EXPECT_DOUBLE_EQ(ghz(), 2.596130);
  f.cpuinfo_mhz = 800;  // a powersave core's MHz: the model name's base clock is higher
  EXPECT_DOUBLE_EQ(ghz(), 2.4);
}

// What makes cpu_peak fall back to measuring: flops = 0 and the reason, which the log repeats.
TEST(CpuPeak, FallsBackWhereTheDerivationCannotBeTrusted) {
  CpuFacts unknown = zen4_vm();
  unknown.vendor = "";
  unknown.family = unknown.model = -1;
  CpuPeak p = cpu_peak_derive(unknown);
  EXPECT_EQ(p.flops, 0);
  EXPECT_NE(p.how.find("no FMA table entry"), std::string::npos) << p.how;

  CpuFacts no_clock = zen4_vm();
  no_clock.cpuinfo_mhz = no_clock.measured_mhz = 0;
  p = cpu_peak_derive(no_clock);
  EXPECT_EQ(p.flops, 0);
  EXPECT_NE(p.how.find("no clock reading"), std::string::npos) << p.how;

  // AVX-512 in use on a row without it: the row is not this CPU (a mis-numbered model).
  CpuFacts zen3 = zen4_vm();
  zen3.model = 0x01;
  p = cpu_peak_derive(zen3);
  EXPECT_EQ(p.flops, 0);
  EXPECT_NE(p.how.find("AMD Zen 3 row has none"), std::string::npos) << p.how;
}

TEST(CpuPeak, SgemmFallbackMeasuresTheGivenShapes) {
  EXPECT_GT(sgemm_best_gflops({{64, 96, 32}, {0, 5, 5}}, 2), 0);  // the empty shape is skipped
}

// An unknown CPU: the peak is measured, and the description says so and why.
TEST(CpuPeak, UnknownCpuIsMeasuredAndSaysWhy) {
  CpuFacts f = zen4_vm();
  f.vendor = "SomeVendor";
  const CpuPeak p = cpu_peak_or_measure(f, {{64, 96, 32}, {32, 64, 64}});
  EXPECT_TRUE(p.measured);
  EXPECT_GT(p.flops, 0);
  EXPECT_NE(p.how.find("measured, the best of 6 sgemm runs at the model's shapes on 2 threads"), std::string::npos)
      << p.how;
  EXPECT_NE(p.how.find("no FMA table entry for SomeVendor"), std::string::npos) << p.how;

  const CpuPeak known = cpu_peak_or_measure(zen4_vm(), {{64, 96, 32}});  // no measurement needed
  EXPECT_FALSE(known.measured);
  EXPECT_DOUBLE_EQ(known.flops, 2 * 32 * 3.7e9);
}

// This machine: facts read, threads capped at the CPUs this process may use, a peak either way.
TEST(CpuPeak, ReadsThisMachine) {
  const CpuFacts f = cpu_facts_read(100000);
  EXPECT_EQ(f.threads, usable_cores());
#if defined(__x86_64__)
  EXPECT_GT(f.measured_mhz, 0);
  EXPECT_FALSE(f.vendor.empty());
#endif
  const CpuPeak p = cpu_peak(1, {{64, 64, 64}});
  EXPECT_GT(p.flops, 0);
  EXPECT_FALSE(p.how.empty());
}

}  // namespace
}  // namespace llmtrain::kernels
