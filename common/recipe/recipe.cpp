#include "common/recipe/recipe.h"

namespace llmtrain {

const char* to_string(ModelFamily v) { return v == ModelFamily::gpt2 ? "gpt2" : "llama"; }
const char* to_string(DeviceKind v) { return v == DeviceKind::cpu ? "cpu" : "cuda"; }
const char* to_string(Precision v) {
  switch (v) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}
const char* to_string(GradReduceDtype v) { return v == GradReduceDtype::fp32 ? "fp32" : "bf16"; }
const char* to_string(ActivationCheckpointing v) {
  switch (v) {
    case ActivationCheckpointing::none:
      return "none";
    case ActivationCheckpointing::selective:
      return "selective";
    case ActivationCheckpointing::full:
      return "full";
  }
  return "?";
}
const char* to_string(NonFiniteAction v) { return v == NonFiniteAction::stop ? "stop" : "skip"; }
const char* to_string(LrSchedule v) {
  switch (v) {
    case LrSchedule::cosine:
      return "cosine";
    case LrSchedule::linear:
      return "linear";
    case LrSchedule::constant:
      return "constant";
  }
  return "?";
}
const char* to_string(PipelineSchedule v) {
  switch (v) {
    case PipelineSchedule::gpipe:
      return "gpipe";
    case PipelineSchedule::one_f_one_b:
      return "1f1b";
    case PipelineSchedule::interleaved:
      return "interleaved";
    case PipelineSchedule::zero_bubble:
      return "zero_bubble";
  }
  return "?";
}

}  // namespace llmtrain
