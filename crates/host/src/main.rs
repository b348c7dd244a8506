fn main() -> std::process::ExitCode {
    return_large_buffers_to_the_os();
    switchyard::cli::main()
}

/// glibc serves large allocations with `mmap` and returns them to the OS on `free`, but each
/// such `free` also raises its threshold (up to 32 MiB), after which request-sized buffers (an
/// 8 MiB body, a decoded image) come from the heap and stay resident after the request: a
/// server that has seen a few large requests keeps twice its memory. A fixed threshold keeps
/// every large buffer, the plugins' included, going back to the OS.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_large_buffers_to_the_os() {
    /// glibc's default threshold; fixing it disables the dynamic adjustment.
    const THRESHOLD: libc::c_int = 128 * 1024;
    // SAFETY: mallopt only sets an allocator parameter; it is called first thing in `main`,
    // before any other thread exists or anything is allocated that depends on the setting.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_buffers_to_the_os() {}
