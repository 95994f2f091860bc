//! What the spilling stages' tests share: a pipeline run document by
//! document through the executor under a given memory limit (so blocking
//! stages spill or fail as they would on a real read), and the same pipeline
//! run in memory as the reference it must equal.

use bson::Document;

use crate::query::aggregate::exec::Exec;
use crate::query::aggregate::{Pipeline, Runtime};
use crate::query::limits::ReadLimits;

pub(crate) fn streamed(
    pipeline: &[Document],
    docs: &[Document],
    memory_limit_bytes: usize,
    allow_disk_use: bool,
) -> crate::error::Result<Vec<Document>> {
    let p = Pipeline::parse(pipeline)?;
    let mut rt = Runtime::standalone();
    rt.limits = ReadLimits {
        memory_limit_bytes,
        allow_disk_use,
        ..ReadLimits::default()
    };
    let mut exec = Exec::new(&p.stages, None, &[], &rt);
    for d in docs {
        if exec.push_document(d.clone())?.is_break() {
            break;
        }
    }
    exec.finish()
}

pub(crate) fn reference(pipeline: &[Document], docs: &[Document]) -> Vec<Document> {
    Pipeline::parse(pipeline)
        .expect("parse")
        .run_on(docs.to_vec())
        .expect("reference")
}
