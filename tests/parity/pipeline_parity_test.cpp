// The whole FluxPipeline in one process against diffusers, for every pipeline case of the
// manifest: token ids, embeddings, initial noise (bit for bit), the noise prediction and latents
// after every step and the final latents (kTolPipelineFp32 = 1e-4 relative), and the image (every
// pixel within +-1 of the reference PNG, at least 99 % identical). The same code path as the
// `fluxmpi` command (pipeline/text_stage, pipeline/noise, pipeline/denoise, vae/decode_image).

#include <gtest/gtest.h>

#include "io/model_dir.h"
#include "pipeline_case.h"
#include "support/fixtures.h"

namespace fluxmpi::pipeline {
namespace {

class PipelineParity : public testing::TestWithParam<test::CaseRef> {};

TEST_P(PipelineParity, WholeRunMatchesDiffusers) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  check_pipeline_run(io::ModelDir(c.model_dir), c, test::fixture_root());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineParity, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::pipeline
