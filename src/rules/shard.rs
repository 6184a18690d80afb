//! Which shard a job belongs to.

/// `seahash(job name bytes) % shards`.
///
/// This mapping is part of the on-disk contract: changing it would silently move jobs between
/// shards on upgrade, so a unit test pins it on fixed names.
pub fn shard_of(job_name: &str, shards: u32) -> u32 {
    (seahash::hash(job_name.as_bytes()) % u64::from(shards.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::shard_of;

    #[test]
    fn pinned_shard_numbers() {
        let pinned: &[(&str, u32, u32)] = &[
            ("rotate-logs", 1, 0),
            ("rotate-logs", 16, 5),
            ("rotate-logs", 4096, 1509),
            ("backup", 16, 12),
            ("backup", 4096, 3948),
            ("a", 16, 13),
            ("a", 4096, 2381),
            ("report.daily", 16, 4),
            ("report.daily", 4096, 20),
            ("x_y-z", 16, 8),
            ("x_y-z", 4096, 568),
        ];
        for (name, shards, expected) in pinned {
            assert_eq!(shard_of(name, *shards), *expected, "{name} in {shards} shards");
        }
    }
}
