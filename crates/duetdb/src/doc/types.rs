//! MongoDB's names of the BSON types (`$type` aliases, `$type` expression
//! results, error messages): one table, read in both directions.

use bson::spec::ElementType;
use bson::Bson;

/// `(alias, element type)` for every BSON type, in MongoDB's numbering order.
const TYPES: [(&str, ElementType); 21] = [
    ("double", ElementType::Double),
    ("string", ElementType::String),
    ("object", ElementType::EmbeddedDocument),
    ("array", ElementType::Array),
    ("binData", ElementType::Binary),
    ("undefined", ElementType::Undefined),
    ("objectId", ElementType::ObjectId),
    ("bool", ElementType::Boolean),
    ("date", ElementType::DateTime),
    ("null", ElementType::Null),
    ("regex", ElementType::RegularExpression),
    ("dbPointer", ElementType::DbPointer),
    ("javascript", ElementType::JavaScriptCode),
    ("symbol", ElementType::Symbol),
    ("javascriptWithScope", ElementType::JavaScriptCodeWithScope),
    ("int", ElementType::Int32),
    ("timestamp", ElementType::Timestamp),
    ("long", ElementType::Int64),
    ("decimal", ElementType::Decimal128),
    ("minKey", ElementType::MinKey),
    ("maxKey", ElementType::MaxKey),
];

/// MongoDB's alias of `t` (`"objectId"`, `"long"`, …).
pub fn alias_of(t: ElementType) -> &'static str {
    TYPES
        .iter()
        .find(|(_, e)| *e == t)
        .map(|(a, _)| *a)
        .unwrap_or("unknown")
}

/// The type an alias names (`"number"` is not one type: callers handle it).
pub fn from_alias(alias: &str) -> Option<ElementType> {
    TYPES.iter().find(|(a, _)| *a == alias).map(|(_, e)| *e)
}

/// MongoDB's type name of a value.
pub fn type_name(v: &Bson) -> &'static str {
    alias_of(v.element_type())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_agree() {
        for (alias, t) in TYPES {
            assert_eq!(from_alias(alias), Some(t));
            assert_eq!(alias_of(t), alias);
        }
        assert_eq!(type_name(&Bson::Int64(1)), "long");
        assert_eq!(type_name(&Bson::Document(Default::default())), "object");
        assert_eq!(from_alias("number"), None);
    }
}
