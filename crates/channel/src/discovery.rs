//! STUB
#![allow(missing_docs)]
use crate::{group::GroupKeys, Level};
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    pub server: String,
    pub targets: Vec<CatalogTarget>,
}
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogTarget {
    pub name: String,
    pub alias: Option<String>,
    pub luns: Vec<CatalogLun>,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogLun {
    pub lun: u64,
    pub blocks: u64,
    pub block_size: u32,
    pub level: Level,
}
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("x")]
    X,
}
pub fn query(_k: &GroupKeys, _now: u64, _n: [u8; 16]) -> Vec<u8> {
    todo!()
}
#[derive(Debug)]
pub struct DiscoveryResponder;
impl DiscoveryResponder {
    pub fn new(_k: GroupKeys) -> Self {
        todo!()
    }
    pub fn handle_query(
        &mut self,
        _f: &[u8],
        _now: u64,
        _c: &Catalog,
        _mf: usize,
    ) -> Result<Vec<Vec<u8>>, DiscoveryError> {
        todo!()
    }
}
#[derive(Debug)]
pub struct ReplyPart {
    pub index: u8,
    pub count: u8,
    pub catalog: Catalog,
}
pub fn open_reply(_k: &GroupKeys, _n: &[u8; 16], _f: &[u8]) -> Result<ReplyPart, DiscoveryError> {
    todo!()
}
