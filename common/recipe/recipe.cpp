#include "common/recipe/recipe.h"

#include <algorithm>
#include <cmath>

namespace llmtrain {
namespace {

constexpr EnumName<ModelFamily> kModelFamily[] = {{"gpt2", ModelFamily::gpt2}, {"llama", ModelFamily::llama}};
constexpr EnumName<DeviceKind> kDeviceKind[] = {{"cpu", DeviceKind::cpu}, {"cuda", DeviceKind::cuda}};
constexpr EnumName<Precision> kPrecision[] = {
    {"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}};
constexpr EnumName<GradReduceDtype> kGradReduceDtype[] = {{"fp32", GradReduceDtype::fp32},
                                                          {"bf16", GradReduceDtype::bf16}};
constexpr EnumName<ActivationCheckpointing> kActivationCheckpointing[] = {
    {"none", ActivationCheckpointing::none},
    {"selective", ActivationCheckpointing::selective},
    {"full", ActivationCheckpointing::full}};
constexpr EnumName<NonFiniteAction> kNonFiniteAction[] = {{"stop", NonFiniteAction::stop},
                                                          {"skip", NonFiniteAction::skip}};
constexpr EnumName<LrSchedule> kLrSchedule[] = {{"cosine", LrSchedule::cosine},
                                                {"linear", LrSchedule::linear},
                                                {"constant", LrSchedule::constant},
                                                {"wsd", LrSchedule::wsd}};
constexpr EnumName<WsdShape> kWsdShape[] = {{"linear", WsdShape::linear}, {"1-sqrt", WsdShape::one_minus_sqrt}};
constexpr EnumName<StateDtype> kStateDtype[] = {{"fp32", StateDtype::fp32}, {"bf16", StateDtype::bf16}};
constexpr EnumName<OptimizerName> kOptimizerName[] = {{"adamw", OptimizerName::adamw}, {"muon", OptimizerName::muon}};
constexpr EnumName<MuonAdjustLr> kMuonAdjustLr[] = {{"original", MuonAdjustLr::original},
                                                    {"match_rms_adamw", MuonAdjustLr::match_rms_adamw}};
constexpr EnumName<PipelineSchedule> kPipelineSchedule[] = {{"gpipe", PipelineSchedule::gpipe},
                                                            {"1f1b", PipelineSchedule::one_f_one_b},
                                                            {"interleaved", PipelineSchedule::interleaved},
                                                            {"zero_bubble", PipelineSchedule::zero_bubble}};
constexpr EnumName<CpComm> kCpComm[] = {{"ring", CpComm::ring}, {"all_to_all", CpComm::all_to_all}};
constexpr EnumName<DeviceCommKind> kDeviceCommKind[] = {
    {"auto", DeviceCommKind::automatic}, {"nccl", DeviceCommKind::nccl}, {"staged", DeviceCommKind::staged}};
constexpr EnumName<OffloadKind> kOffloadKind[] = {
    {"none", OffloadKind::none}, {"host", OffloadKind::host}, {"nvme", OffloadKind::nvme}};
constexpr EnumName<ProfileMode> kProfileMode[] = {{"none", ProfileMode::none}, {"ops", ProfileMode::ops}};
constexpr EnumName<RopeScalingType> kRopeScalingType[] = {{"none", RopeScalingType::none},
                                                          {"linear", RopeScalingType::linear},
                                                          {"llama3", RopeScalingType::llama3},
                                                          {"yarn", RopeScalingType::yarn}};
constexpr EnumName<MlpActivation> kMlpActivation[] = {{"swiglu", MlpActivation::swiglu},
                                                      {"geglu", MlpActivation::geglu}};

}  // namespace

double RopeScalingConfig::yarn_attention_factor() const {
  if (attention_factor > 0) return attention_factor;
  auto m = [&](double k) { return factor <= 1 ? 1.0 : 0.1 * k * std::log(factor) + 1.0; };
  if (mscale != 0 && mscale_all_dim != 0) return m(mscale) / m(mscale_all_dim);
  return m(1);
}

int64_t OptimizerConfig::wsd_decay_length() const {
  if (wsd_decay_steps > 0) return wsd_decay_steps;
  return std::max<int64_t>(1, std::llround(wsd_decay_fraction * double(decay_steps)));
}

std::span<const EnumName<ModelFamily>> enum_names(ModelFamily) { return kModelFamily; }
std::span<const EnumName<DeviceKind>> enum_names(DeviceKind) { return kDeviceKind; }
std::span<const EnumName<Precision>> enum_names(Precision) { return kPrecision; }
std::span<const EnumName<GradReduceDtype>> enum_names(GradReduceDtype) { return kGradReduceDtype; }
std::span<const EnumName<ActivationCheckpointing>> enum_names(ActivationCheckpointing) {
  return kActivationCheckpointing;
}
std::span<const EnumName<NonFiniteAction>> enum_names(NonFiniteAction) { return kNonFiniteAction; }
std::span<const EnumName<LrSchedule>> enum_names(LrSchedule) { return kLrSchedule; }
std::span<const EnumName<WsdShape>> enum_names(WsdShape) { return kWsdShape; }
std::span<const EnumName<StateDtype>> enum_names(StateDtype) { return kStateDtype; }
std::span<const EnumName<OptimizerName>> enum_names(OptimizerName) { return kOptimizerName; }
std::span<const EnumName<MuonAdjustLr>> enum_names(MuonAdjustLr) { return kMuonAdjustLr; }
std::span<const EnumName<PipelineSchedule>> enum_names(PipelineSchedule) { return kPipelineSchedule; }
std::span<const EnumName<CpComm>> enum_names(CpComm) { return kCpComm; }
std::span<const EnumName<RopeScalingType>> enum_names(RopeScalingType) { return kRopeScalingType; }
std::span<const EnumName<MlpActivation>> enum_names(MlpActivation) { return kMlpActivation; }
std::span<const EnumName<DeviceCommKind>> enum_names(DeviceCommKind) { return kDeviceCommKind; }
std::span<const EnumName<OffloadKind>> enum_names(OffloadKind) { return kOffloadKind; }
std::span<const EnumName<ProfileMode>> enum_names(ProfileMode) { return kProfileMode; }

}  // namespace llmtrain
