//! STUB
#![allow(missing_docs)]
#[derive(Debug, Clone)]
pub struct GroupKeys;
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("x")]
    X,
}
impl GroupKeys {
    pub fn derive(_g: &str, _s: &[u8]) -> Result<GroupKeys, GroupError> {
        todo!()
    }
    pub fn group(&self) -> &str {
        todo!()
    }
}
pub fn load_secret(
    _f: Option<&std::path::Path>,
    _e: Option<&str>,
    _c: Option<&str>,
) -> Result<Vec<u8>, GroupError> {
    todo!()
}
