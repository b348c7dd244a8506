//! Plain f32 matrix products with explicit strides, for attention (scores and weighted values
//! straight out of the row-major q/k/v buffers, without transposing copies).

/// Plain f32 GEMM, `c[m, n] = a[m, k] · b[k, n]` with explicit strides (for attention).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rsa: usize,
    csa: usize,
    b: &[f32],
    rsb: usize,
    csb: usize,
    c: &mut [f32],
    rsc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.len() > (m - 1) * rsa + k.saturating_sub(1) * csa || k == 0);
    assert!(b.len() > k.saturating_sub(1) * rsb + (n - 1) * csb || k == 0);
    assert!(c.len() >= (m - 1) * rsc + n);
    // SAFETY: bounds asserted above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            0.0,
            c.as_mut_ptr(),
            rsc as isize,
            1,
        );
    }
}
