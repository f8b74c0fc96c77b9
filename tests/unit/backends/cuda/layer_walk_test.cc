// The cuda backend's check of the layer programs it walks (engine/backends/cuda/layer_walk.h): every family's
// program passes; programs that break its fusions are refused, naming the op or the fusion.
#include "engine/backends/cuda/layer_walk.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

using enum LayerOp;

TEST(LayerWalk, EveryFamilysLayerIsWalked) {
  for (const Architecture* arch :
       {&LlamaArchitecture(), &Qwen2Architecture(), &Qwen3Architecture(), &Gemma2Architecture(), &Gemma3Architecture(),
        &Phi3Architecture(), &MixtralArchitecture(), &Qwen3MoeArchitecture()}) {
    EXPECT_EQ(LayerWalkProblem(*arch), "") << arch->name;
  }
}

// A family's dense layers (a mixture's layers without experts) are checked as its sparse ones are.
TEST(LayerWalk, ADenseLayerProgramIsCheckedToo) {
  Architecture arch = Qwen3MoeArchitecture();
  arch.dense_layer = {kInputNorm, kQkvProj,    kRope,    kWriteKv,  kAttention, kOutProj,
                      kResidual,  kGateUpProj, kSiluMul, kDownProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("'gate_up_proj'"), std::string::npos) << LayerWalkProblem(arch);
}

TEST(LayerWalk, ProgramsThatBreakItsFusionsAreRefusedNamingTheOp) {
  Architecture arch = LlamaArchitecture();
  // A residual add straight into the MLP, without the norm the add is fused with.
  arch.layer = {kInputNorm, kQkvProj,    kRope,    kWriteKv,  kAttention, kOutProj,
                kResidual,  kGateUpProj, kSiluMul, kDownProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("'gate_up_proj'"), std::string::npos) << LayerWalkProblem(arch);
  arch.layer = {kInputNorm, kQkvProj, kRope, kQkNorm, kWriteKv, kAttention, kOutProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("rotary"), std::string::npos) << LayerWalkProblem(arch);
  arch.layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kQkNorm, kAttention, kOutProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("q/k norms"), std::string::npos) << LayerWalkProblem(arch);
  arch.layer = {kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("input norm"), std::string::npos) << LayerWalkProblem(arch);
  arch.layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kPostNorm, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("post-attention norm"), std::string::npos) << LayerWalkProblem(arch);
  // The gate/up product and its activation are one kernel at decode.
  arch.layer = {kInputNorm, kQkvProj,  kRope,       kWriteKv,  kAttention, kOutProj,
                kResidual,  kPostNorm, kGateUpProj, kDownProj, kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("gated activation"), std::string::npos) << LayerWalkProblem(arch);
  arch.layer = {kInputNorm, kQkvProj,  kRope,    kWriteKv,    kAttention, kOutProj,
                kResidual,  kPostNorm, kSiluMul, kGateUpProj, kDownProj,  kResidual};
  EXPECT_NE(LayerWalkProblem(arch).find("gated activation"), std::string::npos) << LayerWalkProblem(arch);
}

}  // namespace
}  // namespace inferd
