//! The server process's own figures, from `/proc/self` (Linux).

/// What `/proc/self` says about the process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Process {
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_bytes: u64,
    pub(crate) open_fds: u64,
    pub(crate) threads: u64,
    pub(crate) start_time_seconds: f64,
}

/// The figures now; `None` where `/proc` is not there or unreadable.
pub(crate) fn read() -> Option<Process> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    // SAFETY: sysconf only reads configuration values.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    parse(&stat, &boot, open_fds, ticks, page)
}

/// Parse `/proc/self/stat` and `/proc/stat`'s `btime`.
fn parse(stat: &str, proc_stat: &str, open_fds: u64, ticks: i64, page: i64) -> Option<Process> {
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let page = u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096);
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on: index 0 is field 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { f.get(n.checked_sub(3)?)?.parse().ok() };
    let utime = field(14)?;
    let stime = field(15)?;
    let threads = field(20)?;
    let start_ticks = field(22)?;
    let rss_pages = field(24)?;
    let btime: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Process {
        cpu_seconds: (utime.saturating_add(stime)) as f64 / ticks,
        resident_bytes: rss_pages.saturating_mul(page),
        open_fds,
        threads,
        start_time_seconds: btime as f64 + start_ticks as f64 / ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_the_name() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 123456 300 18446744073709551615";
        let p = parse(stat, "cpu 1 2 3\nbtime 1700000000\n", 9, 100, 4096).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.threads, 7);
        assert_eq!(p.resident_bytes, 300 * 4096);
        assert_eq!(p.start_time_seconds, 1700000010.0);
        assert_eq!(p.open_fds, 9);
    }

    #[test]
    fn garbage_is_none_not_a_panic() {
        for s in [
            "",
            ")",
            "1 (x)",
            "1 (x) S 1 2",
            "((((",
            "1 (x) S a b c d e f g h i j k l m n o p q r s t u v",
        ] {
            assert_eq!(parse(s, "btime 1\n", 0, 100, 4096), None);
        }
        assert!(read().is_some());
    }
}
