// The CPU's theoretical fp32 peak, the rate MFU is measured against on a CPU (docs/metrics.md,
// "MFU"): threads × FLOPs per cycle per core × clock, where FLOPs per cycle = the widest vector the
// kernels use (OpenBLAS's core for the GEMMs, the AVX-512 dispatch for attention) × that width's
// FMA instructions per cycle (a table by vendor, family and model) × 2. Where the CPU is not in the
// table or no clock can be read, the best of several sgemm runs at the model's shapes stands in.
//
// Rules a reader could get wrong:
//  - Every clock reading is kept and the highest wins. No single source is a maximum everywhere:
//    acpi-cpufreq's cpuinfo_max_freq and the model name's "@ 2.40GHz" leave turbo out, a VM's
//    "cpu MHz" is the host's nominal clock. The measured clock (a chain of dependent adds, best of
//    many short bursts on one core) catches turbo, and load cannot lower it: a burst lasts tens of
//    microseconds, so a busy machine delays some bursts, not all.
//  - Where the table is unsure (parts of one family that differ, a family's mobile and desktop
//    cores), a row holds the larger figure: an over-estimate lowers MFU; an under-estimate shows
//    utilizations above 100%, which tells the user nothing.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/host.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "kernels/cpu/cpu_ops.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// OpenBLAS exports this beside the CBLAS interface (kernels/cpu/blas_info.cpp reads it too).
extern "C" char* openblas_get_corename(void);

namespace llmtrain::kernels {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A whole number at the start of `s` (after blanks); -1 when there is none.
int parse_int(std::string_view s, int base = 10) {
  const std::string t = trim(s);
  int v = -1;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v, base);
  return ec == std::errc() && end != t.data() ? v : -1;
}

// A positive number at the start of `s`; 0 when there is none.
double parse_positive(std::string_view s) {
  const std::string t = trim(s);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  return end != t.c_str() && v > 0 ? v : 0.0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return in ? ss.str() : std::string();
}

// Xeon Scalable of the first two generations (Skylake-SP x1xx, Cascade Lake x2xx) have one AVX-512
// FMA unit in Bronze 3xxx, Silver 4xxx and Gold 5xxx, except Gold 5122 and 5222; the rest have two
// (Intel ARK, "# of AVX-512 FMA Units"). Unknown names get two.
bool xeon_with_one_avx512_fma(std::string_view name) {
  struct Tier {
    std::string_view word;
    int series;
  };
  for (const Tier& t : {Tier{"Bronze ", 3}, Tier{"Silver ", 4}, Tier{"Gold ", 5}}) {
    const size_t at = name.find(t.word);
    if (at == std::string_view::npos) continue;
    const std::string_view digits = name.substr(at + t.word.size(), 4);
    if (digits.size() != 4 || !std::all_of(digits.begin(), digits.end(),
                                           [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }))
      return false;
    const int number = parse_int(digits), generation = number / 100 % 10;
    return number / 1000 == t.series && (generation == 1 || generation == 2) && number != 5122 && number != 5222;
  }
  return false;
}

std::optional<CpuCoreSpec> intel_lookup(int family, int model, std::string_view name) {
  if (family != 6) return std::nullopt;
  switch (model) {
    case 0x3C:
    case 0x3F:
    case 0x45:
    case 0x46:
      return CpuCoreSpec{"Intel Haswell", 2, 0};
    case 0x3D:
    case 0x47:
    case 0x4F:
    case 0x56:
      return CpuCoreSpec{"Intel Broadwell", 2, 0};
    case 0x4E:
    case 0x5E:
    case 0x8E:
    case 0x9E:
    case 0xA5:
    case 0xA6:
      return CpuCoreSpec{"Intel Skylake client (to Comet Lake)", 2, 0};
    case 0x55:  // Skylake-SP/X, Cascade Lake, Cooper Lake: one model number, told apart by name
      return xeon_with_one_avx512_fma(name) ? CpuCoreSpec{"Intel Skylake-SP/Cascade Lake, 1 AVX-512 FMA unit", 2, 1}
                                            : CpuCoreSpec{"Intel Skylake-SP/Cascade Lake, 2 AVX-512 FMA units", 2, 2};
    case 0x66:
      return CpuCoreSpec{"Intel Cannon Lake", 2, 1};
    case 0x7D:
    case 0x7E:
      return CpuCoreSpec{"Intel Ice Lake client", 2, 1};
    case 0x6A:
    case 0x6C:
      return CpuCoreSpec{"Intel Ice Lake-SP", 2, 2};
    case 0x8C:
    case 0x8D:
      return CpuCoreSpec{"Intel Tiger Lake", 2, 1};
    case 0xA7:
      return CpuCoreSpec{"Intel Rocket Lake", 2, 1};
    case 0x97:
    case 0x9A:
    case 0xB7:
    case 0xBA:
    case 0xBF:
    case 0xAA:
    case 0xAC:
    case 0xBD:
    case 0xC5:
    case 0xC6:
      // Hybrid: the P-cores' figure for every core (E-cores do half), the upper bound.
      return CpuCoreSpec{"Intel hybrid (Alder Lake to Arrow Lake), P-core", 2, 0};
    case 0x8F:
      return CpuCoreSpec{"Intel Sapphire Rapids", 2, 2};
    case 0xCF:
      return CpuCoreSpec{"Intel Emerald Rapids", 2, 2};
    case 0xAD:
    case 0xAE:
      return CpuCoreSpec{"Intel Granite Rapids", 2, 2};
    case 0xAF:
      return CpuCoreSpec{"Intel Sierra Forest (E-cores)", 1, 0};
    default:
      return std::nullopt;
  }
}

std::optional<CpuCoreSpec> amd_lookup(int family, int model) {
  if (family == 0x17 && model >= 0 && model < 0x30) return CpuCoreSpec{"AMD Zen/Zen+", 1, 0};
  if (family == 0x18) return CpuCoreSpec{"Hygon Dhyana (Zen)", 1, 0};
  if (family == 0x17 && model >= 0x30) return CpuCoreSpec{"AMD Zen 2", 2, 0};
  if (family == 0x19) {
    const bool zen4 =
        (model >= 0x10 && model <= 0x1F) || (model >= 0x60 && model <= 0x7F) || (model >= 0xA0 && model <= 0xAF);
    // Zen 4 executes a 512-bit FMA as two 256-bit halves: AVX-512 does not raise its peak.
    return zen4 ? CpuCoreSpec{"AMD Zen 4", 2, 1} : CpuCoreSpec{"AMD Zen 3", 2, 0};
  }
  // Zen 5 desktop and server cores have 512-bit FMA pipes; mobile ones split them like Zen 4. The
  // table takes the larger.
  if (family == 0x1A) return CpuCoreSpec{"AMD Zen 5", 2, 2};
  return std::nullopt;
}

const char* width_name(int bits) { return bits >= 512 ? "AVX-512" : bits >= 256 ? "AVX2" : "SSE"; }

struct ClockReading {
  const char* source;
  double mhz;
};

// Every readable clock, highest first (ties keep the order below).
std::vector<ClockReading> clock_readings(const CpuFacts& f) {
  std::vector<ClockReading> r;
  for (const ClockReading& c : {ClockReading{"cpufreq max", f.cpufreq_max_mhz}, ClockReading{"cpuid", f.cpuid_max_mhz},
                                ClockReading{"model name", f.name_mhz}, ClockReading{"measured", f.measured_mhz},
                                ClockReading{"/proc/cpuinfo", f.cpuinfo_mhz}})
    if (c.mhz > 0) r.push_back(c);
  std::stable_sort(r.begin(), r.end(), [](const ClockReading& a, const ClockReading& b) { return a.mhz > b.mhz; });
  return r;
}

#if defined(__x86_64__)
#define LT_ADD4 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
// One burst of 16 × kIterations register adds, each depending on the one before: one per cycle on
// every x86-64 core (a register operand: no core folds these away, as some do immediates).
double add_burst_mhz() {
  constexpr int kIterations = 4096;
  uint64_t x = 0, one = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kIterations; ++i) asm volatile(LT_ADD4 LT_ADD4 LT_ADD4 LT_ADD4 : "+r"(x) : "r"(one));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 16.0 * kIterations / std::max(s, 1e-9) / 1e6;
}
#undef LT_ADD4

// The core's clock: the best of at least 200 bursts over at least 25 ms (a power-saving core ramps
// up meanwhile), at most 5000 bursts.
double measure_core_mhz() {
  const auto start = std::chrono::steady_clock::now();
  double best = 0;
  for (int b = 0; b < 5000; ++b) {
    best = std::max(best, add_burst_mhz());
    if (b >= 200 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(25)) break;
  }
  return best;
}

double cpuid_max_mhz() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 0x16) return 0;
  __cpuid_count(0x16, 0, a, b, c, d);
  return double(b & 0xFFFF);
}
#else
double measure_core_mhz() { return 0; }
double cpuid_max_mhz() { return 0; }
#endif

}  // namespace

std::string format_rate(double flops) {
  if (flops >= 1e12) return fmt::format("{:.3g} TFLOP/s", flops / 1e12);
  return fmt::format("{:.3g} GFLOP/s", flops / 1e9);
}

std::optional<CpuCoreSpec> cpu_core_lookup(std::string_view vendor, int family, int model, std::string_view name) {
  if (vendor == "GenuineIntel") return intel_lookup(family, model, name);
  if (vendor == "AuthenticAMD" || vendor == "HygonGenuine") return amd_lookup(family, model);
  return std::nullopt;
}

int blas_core_vector_bits(std::string_view corename) {
  const std::string c = lower(corename);
  for (const char* k : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == k) return 512;
  for (const char* k : {"haswell", "zen", "excavator", "sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (c == k) return 256;
  return 128;
}

double model_name_mhz(std::string_view name) {
  const size_t at = name.find('@');
  if (at == std::string_view::npos) return 0;
  const std::string rest(name.substr(at + 1));
  char* end = nullptr;
  const double v = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str() || v <= 0) return 0;
  const std::string unit = lower(trim(std::string_view(end)));
  if (starts_with(unit, "ghz")) return v * 1000;
  if (starts_with(unit, "mhz")) return v;
  return 0;
}

double cpufreq_khz_to_mhz(std::string_view text) { return parse_positive(text) / 1000; }

CpuFacts cpuinfo_parse(std::string_view text) {
  CpuFacts f;
  for (const std::string& line : split(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(std::string_view(line).substr(0, colon));
    const std::string_view value = std::string_view(line).substr(colon + 1);
    if (key == "vendor_id" && f.vendor.empty()) f.vendor = trim(value);
    if (key == "cpu family" && f.family < 0) f.family = parse_int(value);
    if (key == "model" && f.model < 0) f.model = parse_int(value);
    if (key == "model name" && f.model_name.empty()) f.model_name = trim(value);
    if (key == "cpu MHz") f.cpuinfo_mhz = std::max(f.cpuinfo_mhz, parse_positive(value));
  }
  f.name_mhz = model_name_mhz(f.model_name);
  return f;
}

CpuFacts cpu_facts_read(int threads) {
  CpuFacts f = cpuinfo_parse(read_text("/proc/cpuinfo"));
  f.threads = std::clamp(threads, 1, usable_cores());
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < std::clamp(cpus, 1L, 4096L); ++c)
    f.cpufreq_max_mhz = std::max(
        f.cpufreq_max_mhz,
        cpufreq_khz_to_mhz(read_text(fmt::format("/sys/devices/system/cpu/cpu{}/cpufreq/cpuinfo_max_freq", c))));
  f.cpuid_max_mhz = cpuid_max_mhz();
  f.measured_mhz = measure_core_mhz();
  f.blas_core = openblas_get_corename();
  f.avx512 = cpu::cpu_has_avx512();
  return f;
}

CpuPeak cpu_peak_derive(const CpuFacts& f) {
  CpuPeak p;
  const std::optional<CpuCoreSpec> spec = cpu_core_lookup(f.vendor, f.family, f.model, f.model_name);
  if (!spec) {
    p.how =
        fmt::format("no FMA table entry for {} family {:#x} model {:#x} ({})", f.vendor.empty() ? "this CPU" : f.vendor,
                    f.family, f.model, f.model_name.empty() ? "no model name" : f.model_name);
    return p;
  }
  const int blas_bits = blas_core_vector_bits(f.blas_core);
  const int widest = std::max({256, blas_bits, f.avx512 ? 512 : 0});  // attention is AVX2 at least
  if (widest >= 512 && spec->fma512 == 0) {
    p.how = fmt::format("the kernels use AVX-512 but the table's {} row has none: not this CPU", spec->name);
    return p;
  }
  const int per_cycle = std::max(2 * 8 * spec->fma256, widest >= 512 ? 2 * 16 * spec->fma512 : 0);
  const std::vector<ClockReading> clocks = clock_readings(f);
  if (clocks.empty()) {
    p.how = fmt::format("no clock reading for the {}", spec->name);
    return p;
  }
  const double ghz = clocks.front().mhz / 1000;
  p.flops = double(f.threads) * per_cycle * ghz * 1e9;
  std::string kernels = fmt::format("{} kernels, OpenBLAS {}", width_name(widest), f.blas_core);
  if (blas_bits < widest)
    kernels = fmt::format("{} attention, OpenBLAS {} at {}", width_name(widest), f.blas_core, width_name(blas_bits));
  std::vector<std::string> read;
  for (const ClockReading& c : clocks) read.push_back(fmt::format("{} {:.3g}", c.source, c.mhz / 1000));
  p.how = fmt::format("{} core{} × {} FLOP/cycle × {:.3g} GHz = {} ({}, {}; clock: the highest of {} GHz)", f.threads,
                      f.threads == 1 ? "" : "s", per_cycle, ghz, format_rate(p.flops), spec->name, kernels,
                      join(read, ", "));
  return p;
}

CpuPeak cpu_peak(int threads, const std::vector<GemmShape>& shapes) {
  return cpu_peak_or_measure(cpu_facts_read(threads), shapes);
}

CpuPeak cpu_peak_or_measure(const CpuFacts& facts, const std::vector<GemmShape>& shapes) {
  CpuPeak p = cpu_peak_derive(facts);
  if (p.flops > 0) return p;
  constexpr int kRounds = 3;
  const double gflops = sgemm_best_gflops(shapes, kRounds);
  LT_CHECK(gflops > 0, "sgemm measured no rate");
  p.how = fmt::format(
      "{} measured, the best of {} sgemm runs at the model's shapes on {} thread{} ({}; a loaded machine lowers "
      "this, log.peak_tflops fixes it)",
      format_rate(gflops * 1e9), kRounds * std::max<size_t>(1, shapes.size()), facts.threads,
      facts.threads == 1 ? "" : "s", p.how);
  p.flops = gflops * 1e9;
  p.measured = true;
  return p;
}

}  // namespace llmtrain::kernels
