//! What the Redis test files share: the keys of a test stream, found and deleted.

#![allow(dead_code)] // each test binary uses what it needs

/// The keys of stream `name` (`{name}:*`; the test names hold no glob characters).
pub fn keys_of(conn: &mut redis::Connection, name: &str) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{{{name}}}:*"))
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Deletes every key of stream `name`.
pub fn delete_keys(conn: &mut redis::Connection, name: &str) -> redis::RedisResult<()> {
    let keys = keys_of(conn, name)?;
    if !keys.is_empty() {
        redis::cmd("UNLINK").arg(&keys).query::<i64>(conn)?;
    }
    Ok(())
}
