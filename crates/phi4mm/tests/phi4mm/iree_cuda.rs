//! `iree.device = "cuda"`: the modules compile for the CUDA target (the compiler needs no GPU),
//! the cache tells the targets apart, and on a machine without a GPU the device itself is a clear
//! error that says what is missing (a build without the `cuda` feature, or no driver). With
//! `PHI4MM_TEST_IREE_DEVICE=cuda` on a GPU machine the device must come up instead, and the
//! whole IREE suite (`iree_support`) runs on it.

use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::config::IreeSettings;
use switchyard_phi4mm::iree::compiler::{CompileTarget, IreeCompiler};
use switchyard_phi4mm::iree::context::IreeContext;
use switchyard_phi4mm::iree::emit::decoder::{emit, DecoderShape};

use crate::iree_support::context;
use crate::model_support::fixture;

#[test]
fn the_device_chooses_the_compile_target() {
    let cuda = IreeSettings {
        device: "cuda".into(),
        ..IreeSettings::default()
    };
    assert_eq!(
        cuda.compile_target(),
        CompileTarget::Cuda {
            arch: "sm_80".into()
        }
    );
    for device in ["local-sync", "local-task"] {
        let local = IreeSettings {
            device: device.into(),
            target_cpu: "znver4".into(),
            ..IreeSettings::default()
        };
        assert_eq!(
            local.compile_target(),
            CompileTarget::LlvmCpu {
                cpu: "znver4".into()
            }
        );
    }
}

#[test]
fn the_fixture_decoder_compiles_for_cuda() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let shape = DecoderShape::new(112, 16, &[1]);
    let module = emit(&ck, &shape);
    let target = CompileTarget::Cuda {
        arch: "sm_80".into(),
    };
    let compiler = IreeCompiler::for_target(None, target).expect("IREE compiler");
    assert!(compiler
        .flags()
        .contains(&"--iree-hal-target-device=cuda".to_string()));
    let bytes = compiler
        .compile(&module.mlir)
        .expect("a CUDA decoder module");
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    // The executables are CUDA's (PTX), and none is the local CPU's.
    assert!(has(b"cuda-nvptx-fb"), "no CUDA executable in the module");
    assert!(!has(b"embedded-elf"), "a CPU executable in a CUDA module");

    // The cache keys modules by target: a CUDA module never answers for a CPU one.
    let cache = &context().cache;
    let cpu = IreeCompiler::new(None, "host").expect("IREE compiler");
    let (cpu_id, cuda_id) = (cpu.identity(cache), compiler.identity(cache));
    assert_ne!(cpu_id.expect("identity"), cuda_id.expect("identity"));

    // Nor may a context pair CUDA modules with a CPU device, or the other way round.
    let mismatch = IreeContext::new(cache.clone(), compiler, "local-sync")
        .err()
        .expect("CUDA modules on local-sync")
        .to_string();
    assert!(mismatch.contains("IREE device `local-sync`"), "{mismatch}");
    let mismatch = IreeContext::new(cache.clone(), cpu, "cuda")
        .err()
        .expect("CPU modules on cuda")
        .to_string();
    assert!(
        mismatch.contains("which this device cannot run"),
        "{mismatch}"
    );
}

#[test]
fn a_cuda_device_exists_only_where_the_suite_was_pointed_at_a_gpu() {
    let runtime = IreeContext::runtime("cuda");
    if crate::iree_support::device() == "cuda" {
        // PHI4MM_TEST_IREE_DEVICE=cuda: this machine has the GPU, and the device must come up.
        if let Err(e) = runtime {
            panic!("PHI4MM_TEST_IREE_DEVICE=cuda, but: {e}");
        }
    } else {
        // No GPU on the CI machines: without the feature there is no driver to find, and with
        // it the driver finds no libcuda.so or no GPU. Either way the error says which.
        let error = runtime
            .err()
            .expect("no CUDA device on this machine")
            .to_string();
        assert!(error.contains("IREE device `cuda`"), "{error}");
        let hint = if cfg!(feature = "cuda") {
            "link libcuda.so to it"
        } else {
            "build the plugin with the `cuda` feature"
        };
        assert!(error.contains(hint), "{error}");
    }

    let error = IreeContext::runtime("tpu")
        .err()
        .expect("no such device")
        .to_string();
    assert!(
        error.contains("devices: `local-sync`, `local-task`"),
        "{error}"
    );
}
