//! glibc malloc settings, so that memory freed by large requests goes back
//! to the operating system.
//!
//! glibc serves a large block (a request body, a decoded tensor, an encoded
//! answer) with mmap, but every time such a block is freed it raises its
//! mmap threshold to that size, so the next ones of that size come from the
//! per-thread arenas, where freed memory stays resident. After a few floods
//! of maximum-size requests, RSS settled at 2.4 times the memory budget
//! (`--max-in-flight-bytes`) here, while the server never held more than
//! the budget at once. Pinning the threshold keeps large blocks on mmap,
//! returned on free, and RSS stays within the budget plus fixed overhead
//! (docs/hardening.md has the figures).
//!
//! One of the server's two `unsafe` blocks outside tests, each one call into
//! the C library: this `mallopt`, and `geteuid` in `shared_memory::object`
//! (whose test-only helpers also call `shm_open`, `ftruncate`, `close` and
//! `shm_unlink`).

/// Blocks this large or larger are mmapped, and unmapped when freed.
const MMAP_THRESHOLD: libc::c_int = 256 << 10;

/// Applies the settings; call first thing in `main`, before threads start.
pub fn return_large_blocks_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes malloc's tuning
    // parameters; it is called before any other thread exists, and a value
    // it refuses is reported by its return code, not by undefined behaviour.
    #[allow(unsafe_code)]
    unsafe {
        if libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 {
            eprintln!("warning: could not set malloc's mmap threshold; RSS may stay high after large requests");
        }
    }
}
