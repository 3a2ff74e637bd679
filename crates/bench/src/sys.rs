//! Small system helpers for the benches: CPU pinning, resident memory, the CPU model.

/// Pins the calling thread to `cpu` (mod the CPUs online). Failure is not fatal: the figure is
/// still valid, only noisier.
pub fn pin(cpu: usize) {
    // SAFETY: sysconf has no preconditions; cpu_set_t is plain data; the syscall reads it.
    unsafe {
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

pub fn cpus() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize }
}

pub fn rss() -> u64 {
    xpf_state::region::resident_bytes()
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Whether transparent huge pages are on for madvise'd regions.
pub fn thp() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
