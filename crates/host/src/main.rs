fn main() -> std::process::ExitCode {
    return_large_buffers_to_the_os();
    trim_the_heap_periodically();
    switchyard::cli::main()
}

/// glibc serves large allocations with `mmap` and returns them to the OS on `free`, but each
/// such `free` also raises its threshold (up to 32 MiB), after which request-sized buffers (an
/// 8 MiB body, a decoded image) come from the heap and stay resident after the request: a
/// server that has seen a few large requests keeps twice its memory. A fixed threshold keeps
/// every large buffer, the plugins' included, going back to the OS.
///
/// Fixing it also fixes the trim threshold, at 128 KiB: then any `free` that left that much
/// free at the top of a thread's arena gave it back with `madvise`, which under load was every
/// other request (and the page faults to take it again). The heap is trimmed once a second
/// instead ([`trim_the_heap_periodically`]), so `free` itself never trims.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_large_buffers_to_the_os() {
    /// glibc's default threshold; fixing it disables the dynamic adjustment.
    const THRESHOLD: libc::c_int = 128 * 1024;
    /// Beyond any arena's top in practice: trimming is the periodic trim's job.
    const NO_TRIM_ON_FREE: libc::c_int = libc::c_int::MAX;
    // SAFETY: mallopt only sets allocator parameters; it is called first thing in `main`,
    // before any other thread exists or anything is allocated that depends on the settings.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, NO_TRIM_ON_FREE);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_buffers_to_the_os() {}

/// Small allocations never reach the `mmap` threshold: a 1 MiB prompt tokenizes into about a
/// million of them on a blocking-pool thread, and once freed they stay resident in that thread's
/// glibc arena, which only returns memory from its top. `malloc_trim` hands every arena's free
/// pages back; once a second it costs microseconds on an idle heap, and it bounds what a burst of
/// hostile requests leaves behind.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_the_heap_periodically() {
    const PERIOD: std::time::Duration = std::time::Duration::from_secs(1);
    let spawned = std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(|| loop {
            std::thread::sleep(PERIOD);
            // SAFETY: malloc_trim only releases free memory of glibc's arenas; it is
            // thread-safe and touches no memory that is in use.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    if let Err(e) = spawned {
        eprintln!("switchyard: heap trimming not started: {e}");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_the_heap_periodically() {}
