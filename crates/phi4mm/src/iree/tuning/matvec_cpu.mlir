// IREE tuning spec for the decoder's matrix-vector products on CPU (passed to the compiler with
// `--iree-codegen-tuning-spec-path`; see `crates/phi4mm/src/iree/compiler.rs`).
//
// A decode step at batch 1 is one `linalg.matvec` per weight, `y = W · x` over the weight as
// stored ([out, in], bf16, the reduction along contiguous memory). IREE's default configuration
// tiles 32 output rows × 16 values of the reduction and transposes every tile in registers to
// sum it, so it runs at about 10 GB/s on a 2-vCPU Zen 4 machine. One output row per vector tile
// and 32 values of the reduction per step keeps one accumulator per row, summed across lanes
// once at the end: 27–29 GB/s on the same machine for the 410 MB LM head (measured with
// iree-benchmark-module; docs/benchmarks.md). It needs FP reductions to be reassociable
// (`--iree-llvmcpu-reassociate-fp-reductions`), as every SIMD dot product is.
module attributes { transform.with_named_sequence, iree_codegen.tuning_spec_with_default_entrypoint } {
  transform.named_sequence @apply_op_config(%op: !transform.any_op {transform.readonly},
                                            %config: !transform.any_param {transform.readonly}) {
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }

  transform.named_sequence @match_matvec(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    transform.match.operation_name %op ["linalg.matvec"] : !transform.any_op
    %config = transform.param.constant #iree_codegen.compilation_info<
        lowering_config = #iree_cpu.lowering_config<distribution = [64, 0],
                                                    vector_common_parallel = [1, 0],
                                                    vector_reduction = [0, 32]>,
        translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>
      > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  transform.named_sequence @__kernel_config(%variant_op: !transform.any_op {transform.consumed})
      -> !transform.any_op attributes { iree_codegen.tuning_spec_entrypoint } {
    %res = transform.foreach_match in %variant_op @match_matvec -> @apply_op_config
        : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }
}
