//! Collection options: what `create` and `collMod` set on a collection
//! besides its indexes, kept with the collection's state (so snapshots,
//! checkpoints and renames carry them) and logged as a whole by the
//! `SetOptions` effect.
//!
//! The stored and logged form is the document `listCollections` reports as
//! `options` (`{}` when every option has its default), so adding an option
//! later changes no format: an older build that meets an option it does not
//! know refuses the document instead of silently dropping it.
//!
//! Options:
//! - `changeStreamPreAndPostImages: {enabled: bool}` — writes record the
//!   version each update, replace and delete changed (the pre-image) in their
//!   effect, for change streams' `fullDocumentBeforeChange`.

use bson::{doc, Bson, Document};

/// The options of one collection (all defaults: none set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectionOptions {
    /// `changeStreamPreAndPostImages: {enabled: true}`.
    pub pre_and_post_images: bool,
}

const PRE_AND_POST_IMAGES: &str = "changeStreamPreAndPostImages";

impl CollectionOptions {
    /// The option's name in `create`, `collMod` and `listCollections`.
    pub const PRE_AND_POST_IMAGES: &'static str = PRE_AND_POST_IMAGES;

    /// The value of `changeStreamPreAndPostImages`: `{enabled: <bool>}`.
    pub fn parse_pre_and_post_images(v: &Bson) -> Result<bool, String> {
        parse_pre_and_post_images(v)
    }

    /// Whether every option has its default.
    pub fn is_default(&self) -> bool {
        *self == CollectionOptions::default()
    }

    /// The `options` document of `listCollections` (empty for defaults).
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        if self.pre_and_post_images {
            d.insert(PRE_AND_POST_IMAGES, doc! {"enabled": true});
        }
        d
    }

    /// Parse the form [`Self::to_document`] writes; an unknown option or a
    /// malformed value is an error naming it.
    pub fn from_document(d: &Document) -> Result<CollectionOptions, String> {
        let mut out = CollectionOptions::default();
        for (k, v) in d {
            match k.as_str() {
                PRE_AND_POST_IMAGES => out.pre_and_post_images = parse_pre_and_post_images(v)?,
                other => return Err(format!("unknown collection option '{other}'")),
            }
        }
        Ok(out)
    }
}

/// The value of `changeStreamPreAndPostImages`: `{enabled: <bool>}`, nothing
/// else (MongoDB's rule, also for `create` and `collMod`).
fn parse_pre_and_post_images(v: &Bson) -> Result<bool, String> {
    let Bson::Document(d) = v else {
        return Err(format!(
            "'{PRE_AND_POST_IMAGES}' must be an object, not {v}"
        ));
    };
    let mut enabled = None;
    for (k, v) in d {
        match (k.as_str(), v) {
            ("enabled", Bson::Boolean(b)) => enabled = Some(*b),
            ("enabled", other) => {
                return Err(format!(
                    "'{PRE_AND_POST_IMAGES}.enabled' must be a boolean, not {other}"
                ))
            }
            (other, _) => {
                return Err(format!(
                    "BSON field '{PRE_AND_POST_IMAGES}.{other}' is an unknown field."
                ))
            }
        }
    }
    enabled.ok_or_else(|| {
        format!("BSON field '{PRE_AND_POST_IMAGES}.enabled' is missing but a required field")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_it_does_not_know() {
        for o in [
            CollectionOptions::default(),
            CollectionOptions {
                pre_and_post_images: true,
            },
        ] {
            assert_eq!(CollectionOptions::from_document(&o.to_document()), Ok(o));
        }
        assert!(CollectionOptions::default().to_document().is_empty());
        assert!(CollectionOptions::from_document(&doc! {"capped": true}).is_err());
        for bad in [
            Bson::Int32(1),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"enabled": 1}),
            Bson::Document(doc! {"enabled": true, "x": 1}),
        ] {
            assert!(parse_pre_and_post_images(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_pre_and_post_images(&Bson::Document(doc! {"enabled": false})),
            Ok(false)
        );
    }
}
