//! The operator tables: every operator's name, and its arity (positional
//! operators, [`Op`]) or its argument names (named-argument operators,
//! [`Named`]).
//!
//! Invariants: a name maps to at most one operator of either table (the
//! parser tries [`Op`] first only for names [`Named`] does not hold, except
//! the date-part operators, which also take one positional argument); the
//! arity and the required names are checked at parse time, so evaluation may
//! rely on them (and re-checks without panicking).

/// Operators with positional arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Mod,
    Abs,
    Floor,
    Ceil,
    Round,
    Trunc,
    Pow,
    Log,
    Log10,
    Ln,
    Exp,
    Sqrt,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Atan2,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    DegreesToRadians,
    RadiansToDegrees,
    Sum,
    Avg,
    StdDevPop,
    StdDevSamp,
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    Cmp,
    Max,
    Min,
    And,
    Or,
    Not,
    Cond,
    IfNull,
    In,
    Size,
    ArrayElemAt,
    First,
    Last,
    ConcatArrays,
    IndexOfArray,
    IsArray,
    Range,
    ReverseArray,
    Slice,
    ArrayToObject,
    ObjectToArray,
    SetUnion,
    SetIntersection,
    SetDifference,
    SetEquals,
    SetIsSubset,
    AnyElementTrue,
    AllElementsTrue,
    Concat,
    ToLower,
    ToUpper,
    SubstrBytes,
    SubstrCP,
    StrLenBytes,
    StrLenCP,
    Split,
    IndexOfBytes,
    IndexOfCP,
    Strcasecmp,
    Type,
    IsNumber,
    ToString,
    ToInt,
    ToLong,
    ToDouble,
    ToDecimal,
    ToBool,
    ToDate,
    ToObjectId,
    ToHashedIndexKey,
    MergeObjects,
    Rand,
    BsonSize,
    BinarySize,
    BitAnd,
    BitOr,
    BitXor,
    BitNot,
    TsSecond,
    TsIncrement,
}

impl Op {
    pub(super) fn from_name(name: &str) -> Option<Op> {
        Some(match name {
            "$add" => Op::Add,
            "$subtract" => Op::Subtract,
            "$multiply" => Op::Multiply,
            "$divide" => Op::Divide,
            "$mod" => Op::Mod,
            "$abs" => Op::Abs,
            "$floor" => Op::Floor,
            "$ceil" => Op::Ceil,
            "$round" => Op::Round,
            "$trunc" => Op::Trunc,
            "$pow" => Op::Pow,
            "$log" => Op::Log,
            "$log10" => Op::Log10,
            "$ln" => Op::Ln,
            "$exp" => Op::Exp,
            "$sqrt" => Op::Sqrt,
            "$sin" => Op::Sin,
            "$cos" => Op::Cos,
            "$tan" => Op::Tan,
            "$asin" => Op::Asin,
            "$acos" => Op::Acos,
            "$atan" => Op::Atan,
            "$atan2" => Op::Atan2,
            "$sinh" => Op::Sinh,
            "$cosh" => Op::Cosh,
            "$tanh" => Op::Tanh,
            "$asinh" => Op::Asinh,
            "$acosh" => Op::Acosh,
            "$atanh" => Op::Atanh,
            "$degreesToRadians" => Op::DegreesToRadians,
            "$radiansToDegrees" => Op::RadiansToDegrees,
            "$sum" => Op::Sum,
            "$avg" => Op::Avg,
            "$stdDevPop" => Op::StdDevPop,
            "$stdDevSamp" => Op::StdDevSamp,
            "$eq" => Op::Eq,
            "$ne" => Op::Ne,
            "$gt" => Op::Gt,
            "$gte" => Op::Gte,
            "$lt" => Op::Lt,
            "$lte" => Op::Lte,
            "$cmp" => Op::Cmp,
            "$max" => Op::Max,
            "$min" => Op::Min,
            "$and" => Op::And,
            "$or" => Op::Or,
            "$not" => Op::Not,
            "$cond" => Op::Cond,
            "$ifNull" => Op::IfNull,
            "$in" => Op::In,
            "$size" => Op::Size,
            "$arrayElemAt" => Op::ArrayElemAt,
            "$first" => Op::First,
            "$last" => Op::Last,
            "$concatArrays" => Op::ConcatArrays,
            "$indexOfArray" => Op::IndexOfArray,
            "$isArray" => Op::IsArray,
            "$range" => Op::Range,
            "$reverseArray" => Op::ReverseArray,
            "$slice" => Op::Slice,
            "$arrayToObject" => Op::ArrayToObject,
            "$objectToArray" => Op::ObjectToArray,
            "$setUnion" => Op::SetUnion,
            "$setIntersection" => Op::SetIntersection,
            "$setDifference" => Op::SetDifference,
            "$setEquals" => Op::SetEquals,
            "$setIsSubset" => Op::SetIsSubset,
            "$anyElementTrue" => Op::AnyElementTrue,
            "$allElementsTrue" => Op::AllElementsTrue,
            "$concat" => Op::Concat,
            "$toLower" => Op::ToLower,
            "$toUpper" => Op::ToUpper,
            "$substrBytes" => Op::SubstrBytes,
            "$substrCP" => Op::SubstrCP,
            "$strLenBytes" => Op::StrLenBytes,
            "$strLenCP" => Op::StrLenCP,
            "$split" => Op::Split,
            "$indexOfBytes" => Op::IndexOfBytes,
            "$indexOfCP" => Op::IndexOfCP,
            "$strcasecmp" => Op::Strcasecmp,
            "$type" => Op::Type,
            "$isNumber" => Op::IsNumber,
            "$toString" => Op::ToString,
            "$toInt" => Op::ToInt,
            "$toLong" => Op::ToLong,
            "$toDouble" => Op::ToDouble,
            "$toDecimal" => Op::ToDecimal,
            "$toBool" => Op::ToBool,
            "$toDate" => Op::ToDate,
            "$toObjectId" => Op::ToObjectId,
            "$toHashedIndexKey" => Op::ToHashedIndexKey,
            "$mergeObjects" => Op::MergeObjects,
            "$rand" => Op::Rand,
            "$bsonSize" => Op::BsonSize,
            "$binarySize" => Op::BinarySize,
            "$bitAnd" => Op::BitAnd,
            "$bitOr" => Op::BitOr,
            "$bitXor" => Op::BitXor,
            "$bitNot" => Op::BitNot,
            "$tsSecond" => Op::TsSecond,
            "$tsIncrement" => Op::TsIncrement,
            "$substr" => Op::SubstrBytes,
            _ => return None,
        })
    }

    /// The operator's name as written (`$add`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "$add",
            Op::Subtract => "$subtract",
            Op::Multiply => "$multiply",
            Op::Divide => "$divide",
            Op::Mod => "$mod",
            Op::Abs => "$abs",
            Op::Floor => "$floor",
            Op::Ceil => "$ceil",
            Op::Round => "$round",
            Op::Trunc => "$trunc",
            Op::Pow => "$pow",
            Op::Log => "$log",
            Op::Log10 => "$log10",
            Op::Ln => "$ln",
            Op::Exp => "$exp",
            Op::Sqrt => "$sqrt",
            Op::Sin => "$sin",
            Op::Cos => "$cos",
            Op::Tan => "$tan",
            Op::Asin => "$asin",
            Op::Acos => "$acos",
            Op::Atan => "$atan",
            Op::Atan2 => "$atan2",
            Op::Sinh => "$sinh",
            Op::Cosh => "$cosh",
            Op::Tanh => "$tanh",
            Op::Asinh => "$asinh",
            Op::Acosh => "$acosh",
            Op::Atanh => "$atanh",
            Op::DegreesToRadians => "$degreesToRadians",
            Op::RadiansToDegrees => "$radiansToDegrees",
            Op::Sum => "$sum",
            Op::Avg => "$avg",
            Op::StdDevPop => "$stdDevPop",
            Op::StdDevSamp => "$stdDevSamp",
            Op::Eq => "$eq",
            Op::Ne => "$ne",
            Op::Gt => "$gt",
            Op::Gte => "$gte",
            Op::Lt => "$lt",
            Op::Lte => "$lte",
            Op::Cmp => "$cmp",
            Op::Max => "$max",
            Op::Min => "$min",
            Op::And => "$and",
            Op::Or => "$or",
            Op::Not => "$not",
            Op::Cond => "$cond",
            Op::IfNull => "$ifNull",
            Op::In => "$in",
            Op::Size => "$size",
            Op::ArrayElemAt => "$arrayElemAt",
            Op::First => "$first",
            Op::Last => "$last",
            Op::ConcatArrays => "$concatArrays",
            Op::IndexOfArray => "$indexOfArray",
            Op::IsArray => "$isArray",
            Op::Range => "$range",
            Op::ReverseArray => "$reverseArray",
            Op::Slice => "$slice",
            Op::ArrayToObject => "$arrayToObject",
            Op::ObjectToArray => "$objectToArray",
            Op::SetUnion => "$setUnion",
            Op::SetIntersection => "$setIntersection",
            Op::SetDifference => "$setDifference",
            Op::SetEquals => "$setEquals",
            Op::SetIsSubset => "$setIsSubset",
            Op::AnyElementTrue => "$anyElementTrue",
            Op::AllElementsTrue => "$allElementsTrue",
            Op::Concat => "$concat",
            Op::ToLower => "$toLower",
            Op::ToUpper => "$toUpper",
            Op::SubstrBytes => "$substrBytes",
            Op::SubstrCP => "$substrCP",
            Op::StrLenBytes => "$strLenBytes",
            Op::StrLenCP => "$strLenCP",
            Op::Split => "$split",
            Op::IndexOfBytes => "$indexOfBytes",
            Op::IndexOfCP => "$indexOfCP",
            Op::Strcasecmp => "$strcasecmp",
            Op::Type => "$type",
            Op::IsNumber => "$isNumber",
            Op::ToString => "$toString",
            Op::ToInt => "$toInt",
            Op::ToLong => "$toLong",
            Op::ToDouble => "$toDouble",
            Op::ToDecimal => "$toDecimal",
            Op::ToBool => "$toBool",
            Op::ToDate => "$toDate",
            Op::ToObjectId => "$toObjectId",
            Op::ToHashedIndexKey => "$toHashedIndexKey",
            Op::MergeObjects => "$mergeObjects",
            Op::Rand => "$rand",
            Op::BsonSize => "$bsonSize",
            Op::BinarySize => "$binarySize",
            Op::BitAnd => "$bitAnd",
            Op::BitOr => "$bitOr",
            Op::BitXor => "$bitXor",
            Op::BitNot => "$bitNot",
            Op::TsSecond => "$tsSecond",
            Op::TsIncrement => "$tsIncrement",
        }
    }

    /// `(min, max)` number of arguments.
    pub(super) fn arity(self) -> (usize, usize) {
        match self {
            Op::BitAnd | Op::BitOr | Op::BitXor => (0, usize::MAX),
            Op::BitNot | Op::TsSecond | Op::TsIncrement => (1, 1),
            Op::Add
            | Op::Multiply
            | Op::And
            | Op::Or
            | Op::ConcatArrays
            | Op::SetUnion
            | Op::SetIntersection
            | Op::Concat
            | Op::MergeObjects => (0, usize::MAX),
            Op::Subtract
            | Op::Divide
            | Op::Mod
            | Op::Pow
            | Op::Log
            | Op::Atan2
            | Op::Eq
            | Op::Ne
            | Op::Gt
            | Op::Gte
            | Op::Lt
            | Op::Lte
            | Op::Cmp
            | Op::In
            | Op::ArrayElemAt
            | Op::SetDifference
            | Op::SetIsSubset
            | Op::Split
            | Op::Strcasecmp => (2, 2),
            Op::Abs
            | Op::Floor
            | Op::Ceil
            | Op::Log10
            | Op::Ln
            | Op::Exp
            | Op::Sqrt
            | Op::Sin
            | Op::Cos
            | Op::Tan
            | Op::Asin
            | Op::Acos
            | Op::Atan
            | Op::Sinh
            | Op::Cosh
            | Op::Tanh
            | Op::Asinh
            | Op::Acosh
            | Op::Atanh
            | Op::DegreesToRadians
            | Op::RadiansToDegrees
            | Op::Not
            | Op::Size
            | Op::First
            | Op::Last
            | Op::IsArray
            | Op::ReverseArray
            | Op::ArrayToObject
            | Op::ObjectToArray
            | Op::AnyElementTrue
            | Op::AllElementsTrue
            | Op::ToLower
            | Op::ToUpper
            | Op::StrLenBytes
            | Op::StrLenCP
            | Op::Type
            | Op::IsNumber
            | Op::ToString
            | Op::ToInt
            | Op::ToLong
            | Op::ToDouble
            | Op::ToDecimal
            | Op::ToBool
            | Op::ToDate
            | Op::ToObjectId
            | Op::ToHashedIndexKey
            | Op::BsonSize
            | Op::BinarySize => (1, 1),
            Op::Round | Op::Trunc => (1, 2),
            Op::Sum | Op::Avg | Op::StdDevPop | Op::StdDevSamp | Op::Max | Op::Min => {
                (0, usize::MAX)
            }
            Op::Cond | Op::SubstrBytes | Op::SubstrCP => (3, 3),
            Op::IfNull | Op::SetEquals => (2, usize::MAX),
            Op::IndexOfArray | Op::IndexOfBytes | Op::IndexOfCP => (2, 4),
            Op::Range | Op::Slice => (2, 3),
            Op::Rand => (0, 0),
        }
    }
}

/// The pattern of the date-part operators (`$year` ... `$isoDayOfWeek`),
/// which share their arguments; a pattern rather than a predicate so the
/// matches that use it stay exhaustive.
macro_rules! date_part {
    () => {
        Named::Year
            | Named::Month
            | Named::DayOfMonth
            | Named::DayOfWeek
            | Named::DayOfYear
            | Named::Hour
            | Named::Minute
            | Named::Second
            | Named::Millisecond
            | Named::Week
            | Named::IsoWeek
            | Named::IsoWeekYear
            | Named::IsoDayOfWeek
    };
}

/// Operators with named arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Year,
    Month,
    DayOfMonth,
    DayOfWeek,
    DayOfYear,
    Hour,
    Minute,
    Second,
    Millisecond,
    Week,
    IsoWeek,
    IsoWeekYear,
    IsoDayOfWeek,
    DateToString,
    DateFromString,
    DateToParts,
    DateFromParts,
    DateTrunc,
    DateAdd,
    DateSubtract,
    DateDiff,
    Convert,
    Trim,
    LTrim,
    RTrim,
    ReplaceOne,
    ReplaceAll,
    RegexMatch,
    RegexFind,
    RegexFindAll,
    Zip,
    SortArray,
    FirstN,
    LastN,
    MaxN,
    MinN,
    GetField,
    SetField,
    UnsetField,
    Median,
    Percentile,
}

impl Named {
    pub(super) fn from_name(name: &str) -> Option<Named> {
        Some(match name {
            "$year" => Named::Year,
            "$month" => Named::Month,
            "$dayOfMonth" => Named::DayOfMonth,
            "$dayOfWeek" => Named::DayOfWeek,
            "$dayOfYear" => Named::DayOfYear,
            "$hour" => Named::Hour,
            "$minute" => Named::Minute,
            "$second" => Named::Second,
            "$millisecond" => Named::Millisecond,
            "$week" => Named::Week,
            "$isoWeek" => Named::IsoWeek,
            "$isoWeekYear" => Named::IsoWeekYear,
            "$isoDayOfWeek" => Named::IsoDayOfWeek,
            "$dateToString" => Named::DateToString,
            "$dateFromString" => Named::DateFromString,
            "$dateToParts" => Named::DateToParts,
            "$dateFromParts" => Named::DateFromParts,
            "$dateTrunc" => Named::DateTrunc,
            "$dateAdd" => Named::DateAdd,
            "$dateSubtract" => Named::DateSubtract,
            "$dateDiff" => Named::DateDiff,
            "$convert" => Named::Convert,
            "$trim" => Named::Trim,
            "$ltrim" => Named::LTrim,
            "$rtrim" => Named::RTrim,
            "$replaceOne" => Named::ReplaceOne,
            "$replaceAll" => Named::ReplaceAll,
            "$regexMatch" => Named::RegexMatch,
            "$regexFind" => Named::RegexFind,
            "$regexFindAll" => Named::RegexFindAll,
            "$zip" => Named::Zip,
            "$sortArray" => Named::SortArray,
            "$firstN" => Named::FirstN,
            "$lastN" => Named::LastN,
            "$maxN" => Named::MaxN,
            "$minN" => Named::MinN,
            "$getField" => Named::GetField,
            "$setField" => Named::SetField,
            "$unsetField" => Named::UnsetField,
            "$median" => Named::Median,
            "$percentile" => Named::Percentile,
            _ => return None,
        })
    }

    /// The operator's name as written.
    pub fn name(self) -> &'static str {
        match self {
            Named::Year => "$year",
            Named::Month => "$month",
            Named::DayOfMonth => "$dayOfMonth",
            Named::DayOfWeek => "$dayOfWeek",
            Named::DayOfYear => "$dayOfYear",
            Named::Hour => "$hour",
            Named::Minute => "$minute",
            Named::Second => "$second",
            Named::Millisecond => "$millisecond",
            Named::Week => "$week",
            Named::IsoWeek => "$isoWeek",
            Named::IsoWeekYear => "$isoWeekYear",
            Named::IsoDayOfWeek => "$isoDayOfWeek",
            Named::DateToString => "$dateToString",
            Named::DateFromString => "$dateFromString",
            Named::DateToParts => "$dateToParts",
            Named::DateFromParts => "$dateFromParts",
            Named::DateTrunc => "$dateTrunc",
            Named::DateAdd => "$dateAdd",
            Named::DateSubtract => "$dateSubtract",
            Named::DateDiff => "$dateDiff",
            Named::Convert => "$convert",
            Named::Trim => "$trim",
            Named::LTrim => "$ltrim",
            Named::RTrim => "$rtrim",
            Named::ReplaceOne => "$replaceOne",
            Named::ReplaceAll => "$replaceAll",
            Named::RegexMatch => "$regexMatch",
            Named::RegexFind => "$regexFind",
            Named::RegexFindAll => "$regexFindAll",
            Named::Zip => "$zip",
            Named::SortArray => "$sortArray",
            Named::FirstN => "$firstN",
            Named::LastN => "$lastN",
            Named::MaxN => "$maxN",
            Named::MinN => "$minN",
            Named::GetField => "$getField",
            Named::SetField => "$setField",
            Named::UnsetField => "$unsetField",
            Named::Median => "$median",
            Named::Percentile => "$percentile",
        }
    }

    /// Its argument names, in the order of `Expr::Named`'s arguments.
    pub(super) fn keys(self) -> &'static [&'static str] {
        match self {
            date_part!() => &["date", "timezone"],
            Named::DateToString => &["date", "format", "timezone", "onNull"],
            Named::DateFromString => &["dateString", "format", "timezone", "onError", "onNull"],
            Named::DateToParts => &["date", "timezone", "iso8601"],
            Named::DateFromParts => &[
                "year",
                "month",
                "day",
                "hour",
                "minute",
                "second",
                "millisecond",
                "isoWeekYear",
                "isoWeek",
                "isoDayOfWeek",
                "timezone",
            ],
            Named::DateTrunc => &["date", "unit", "binSize", "timezone", "startOfWeek"],
            Named::DateAdd | Named::DateSubtract => &["startDate", "unit", "amount", "timezone"],
            Named::DateDiff => &["startDate", "endDate", "unit", "timezone", "startOfWeek"],
            Named::Convert => &["input", "to", "onError", "onNull"],
            Named::Trim | Named::LTrim | Named::RTrim => &["input", "chars"],
            Named::ReplaceOne | Named::ReplaceAll => &["input", "find", "replacement"],
            Named::RegexMatch | Named::RegexFind | Named::RegexFindAll => {
                &["input", "regex", "options"]
            }
            Named::Zip => &["inputs", "useLongestLength", "defaults"],
            Named::SortArray => &["input", "sortBy"],
            Named::FirstN | Named::LastN | Named::MaxN | Named::MinN => &["n", "input"],
            Named::GetField | Named::UnsetField => &["field", "input"],
            Named::SetField => &["field", "input", "value"],
            Named::Median => &["input", "method"],
            Named::Percentile => &["input", "p", "method"],
        }
    }

    /// The arguments that must be given.
    pub(super) fn required(self) -> &'static [&'static str] {
        match self {
            date_part!() | Named::DateToString | Named::DateToParts => &["date"],
            Named::DateFromString => &["dateString"],
            Named::DateFromParts => &[],
            Named::DateTrunc => &["date", "unit"],
            Named::DateAdd | Named::DateSubtract => &["startDate", "unit", "amount"],
            Named::DateDiff => &["startDate", "endDate", "unit"],
            Named::Convert => &["input", "to"],
            Named::Trim | Named::LTrim | Named::RTrim => &["input"],
            Named::ReplaceOne | Named::ReplaceAll => &["input", "find", "replacement"],
            Named::RegexMatch | Named::RegexFind | Named::RegexFindAll => &["input", "regex"],
            Named::Zip => &["inputs"],
            Named::SortArray => &["input", "sortBy"],
            Named::FirstN | Named::LastN | Named::MaxN | Named::MinN => &["n", "input"],
            Named::GetField => &["field"],
            Named::SetField => &["field", "input", "value"],
            Named::UnsetField => &["field", "input"],
            Named::Median => &["input", "method"],
            Named::Percentile => &["input", "p", "method"],
        }
    }

    /// A date-part operator (`$year` ... `$isoDayOfWeek`), which also takes
    /// its date as one positional argument.
    pub(super) fn is_date_part(self) -> bool {
        matches!(self, date_part!())
    }
}
