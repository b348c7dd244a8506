//! Every model case of the fixture on each kernel path (AMX, AVX-512, AVX2, scalar), forced for the
//! whole process: the same tolerances as the default path. A path this CPU lacks is reported on
//! stderr outside the test harness's capture (`SKIPPED: …`), so the skip shows in the output.

use std::io::Write;
use std::sync::Mutex;

use switchyard_phi4mm::kernels::path::{self, KernelPath};

use crate::model_cases::run_case;
use crate::model_support::manifest;

/// One forced path at a time (the setting is process-wide).
static FORCING: Mutex<()> = Mutex::new(());

/// Puts the process back on the default path however the test ends.
struct Unforce;

impl Drop for Unforce {
    fn drop(&mut self) {
        let _ = path::force(None);
    }
}

fn every_case_on(p: KernelPath) {
    let _lock = FORCING.lock().unwrap_or_else(|e| e.into_inner());
    if !p.supported() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: kernel path {p} is not supported by this CPU; the fixture cases did not run on it"
        );
        return;
    }
    path::force(Some(p)).unwrap();
    let _unforce = Unforce;
    let cases: Vec<String> = manifest()["model_cases"]["cases"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(cases.len() >= 14, "fixture cases: {cases:?}");
    for case in &cases {
        assert_eq!(path::active(), p);
        for layout in ["model", "model-original"] {
            run_case(layout, case);
        }
    }
}

#[test]
fn every_case_on_amx() {
    every_case_on(KernelPath::Amx);
}

#[test]
fn every_case_on_avx512() {
    every_case_on(KernelPath::Avx512);
}

#[test]
fn every_case_on_avx2() {
    every_case_on(KernelPath::Avx2);
}

#[test]
fn every_case_on_scalar() {
    every_case_on(KernelPath::Scalar);
}
