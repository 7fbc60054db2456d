//! The datastore's freshness markers, which a node's server writes and its processes
//! read: what both sides of the datastore must agree on.

/// The datastore marker of another node's rank: the generation of the copy on this node
/// and the generation this node knows its owner reached. The copy is fresh while the
/// first is at least the second.
pub fn encode_marker(gen: u64, want: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&gen.to_le_bytes());
    m[8..].copy_from_slice(&want.to_le_bytes());
    m
}

/// Reads a marker written by [`encode_marker`]: `Some(fresh)`, `None` when malformed.
pub fn marker_fresh(m: &[u8]) -> Option<bool> {
    let gen = u64::from_le_bytes(m.get(..8)?.try_into().ok()?);
    let want = u64::from_le_bytes(m.get(8..16)?.try_into().ok()?);
    Some(gen >= want)
}

/// Why a local-only get of a rank on `node` (another node) finds nothing.
pub fn local_only_reason(node: u32) -> String {
    format!("it runs on node {node} and a local-only get does not ask there")
}
