"""MongoDB 7.0's errors for what applications most often get wrong, one
row per case: the command sent, and the code, codeName and message text
MongoDB 7.0 answers with. Each row names where its expectation comes from
(`src:` the server source file of the uassert — file names as in
mongodb/mongo at r7.0 — or `docs:` the manual page), so a row can be
re-checked against its source.

Write errors (inside `writeErrors`) carry no codeName in MongoDB's reply:
their rows give None for it.
"""

from collections import namedtuple

import pytest
from bson.regex import Regex

Row = namedtuple("Row", "name cmd code code_name msg src")

# The collection every row runs against (a fresh database per row).
DOCS = [
    {"_id": 1, "a": 1, "s": "str", "arr": [1, 2], "sub": {"x": 1}, "n": None},
    {"_id": 2, "a": 2, "s": "xyz", "arr": [3], "sub": {"x": 2}},
]

EXPR = "src: db/pipeline/expression.cpp"
MATCH = "src: db/matcher/expression_parser.cpp"
UPD = "src: db/update/"
STAGE = "src: db/pipeline/document_source_*.cpp"
IDX = "src: db/catalog/index_key_validate.cpp"
IDL = "src: idl/idl_parser.cpp"


def find(flt, **kw):
    return {"find": "c", "filter": flt, **kw}


def agg(*stages):
    return {"aggregate": "c", "pipeline": list(stages), "cursor": {}}


def project(expr):
    return agg({"$project": {"_id": 0, "v": expr}})


def update(u, q=None, **kw):
    return {"update": "c", "updates": [{"q": q if q is not None else {"_id": 1}, "u": u, **kw}]}


def create_index(*specs):
    return {"createIndexes": "c", "indexes": list(specs)}


ROWS = [
    # ------------------------------------------------ query operators (find filters)
    Row("unknown operator", find({"a": {"$foo": 1}}), 2, "BadValue",
        "unknown operator: $foo", MATCH),
    Row("unknown top-level operator", find({"$foo": 1}), 2, "BadValue",
        "unknown top level operator: $foo. If you have a field name that starts with a '$' "
        "symbol, consider using $getField or $setField.", MATCH),
    Row("$in needs an array", find({"a": {"$in": 1}}), 2, "BadValue", "$in needs an array", MATCH),
    Row("$nin needs an array", find({"a": {"$nin": 1}}), 2, "BadValue", "$nin needs an array", MATCH),
    Row("$all needs an array", find({"a": {"$all": 1}}), 2, "BadValue", "$all needs an array", MATCH),
    Row("$and not an array", find({"$and": 1}), 2, "BadValue", "$and must be an array", MATCH),
    Row("$or not an array", find({"$or": 1}), 2, "BadValue", "$or must be an array", MATCH),
    Row("$nor not an array", find({"$nor": 1}), 2, "BadValue", "$nor must be an array", MATCH),
    Row("$size not a number", find({"arr": {"$size": "x"}}), 2, "BadValue",
        "$size needs a number", MATCH),
    Row("$size negative", find({"arr": {"$size": -1}}), 2, "BadValue",
        "$size may not be negative", MATCH),
    Row("$size fractional", find({"arr": {"$size": 1.5}}), 2, "BadValue",
        "$size must be a whole number", MATCH),
    Row("$type unknown alias", find({"a": {"$type": "foo"}}), 2, "BadValue",
        "Unknown type name alias: foo", "src: db/matcher/matcher_type_set.cpp"),
    Row("$type unknown code", find({"a": {"$type": 100}}), 2, "BadValue",
        "Invalid numerical type code: 100", "src: db/matcher/matcher_type_set.cpp"),
    Row("$mod not an array", find({"a": {"$mod": 5}}), 2, "BadValue",
        "malformed mod, needs to be an array", MATCH),
    Row("$mod one element", find({"a": {"$mod": [1]}}), 2, "BadValue",
        "malformed mod, not enough elements", MATCH),
    Row("$mod three elements", find({"a": {"$mod": [1, 2, 3]}}), 2, "BadValue",
        "malformed mod, too many elements", MATCH),
    Row("$mod by zero", find({"a": {"$mod": [0, 1]}}), 2, "BadValue",
        "divisor cannot be 0", "src: db/matcher/expression_leaf.cpp"),
    Row("$regex not a string", find({"s": {"$regex": 1}}), 2, "BadValue",
        "$regex has to be a string", MATCH),
    Row("$options without $regex", find({"s": {"$options": "i"}}), 2, "BadValue",
        "$options needs a $regex", MATCH),
    Row("$elemMatch not an object", find({"arr": {"$elemMatch": 1}}), 2, "BadValue",
        "$elemMatch needs an Object", MATCH),
    Row("$not of a number", find({"a": {"$not": 1}}), 2, "BadValue",
        "$not needs a regex or a document", MATCH),
    Row("$not empty", find({"a": {"$not": {}}}), 2, "BadValue", "$not cannot be empty", MATCH),
    Row("$exists without a field", find({"$exists": True}), 2, "BadValue",
        "unknown top level operator: $exists. If you have a field name that starts with a '$' "
        "symbol, consider using $getField or $setField.", MATCH),
    Row("$expr unknown expression", find({"$expr": {"$foo": 1}}), 168, "InvalidPipelineOperator",
        "Unrecognized expression '$foo'", EXPR),
    Row("$regex bad pattern", find({"s": {"$regex": "("}}), 51091, "Location51091",
        "Regular expression is invalid: missing closing parenthesis",
        "src: util/pcre.cpp (PCRE2 message)"),
    Row("$regex bad option", find({"s": {"$regex": "a", "$options": "z"}}), 51108,
        "Location51108", " invalid flag in regex options: z", "src: db/matcher/expression_leaf.cpp"),
    Row("$expr wrong arity", find({"$expr": {"$eq": [1]}}), 16020, "Location16020",
        "Expression $eq takes exactly 2 arguments. 1 were passed in.", EXPR),
    Row("$text without a text index", find({"$text": {"$search": "x"}}), 27, "IndexNotFound",
        "text index required for $text query", "src: db/query/get_executor.cpp"),
    # ------------------------------------------------ find/command fields
    Row("find filter not an object", find(1), 14, "TypeMismatch",
        "BSON field 'find.filter' is the wrong type 'int', expected type 'object'", IDL),
    Row("find unknown field", find({}, foo=1), 40415, "IDLUnknownField",
        "BSON field 'find.foo' is an unknown field.", IDL),
    Row("find negative limit", find({}, limit=-1), 51024, "Location51024",
        "BSON field 'limit' value must be >= 0, actual value '-1'", IDL),
    Row("find negative skip", find({}, skip=-1), 51024, "Location51024",
        "BSON field 'skip' value must be >= 0, actual value '-1'", IDL),
    Row("find negative batchSize", find({}, batchSize=-1), 51024, "Location51024",
        "BSON field 'batchSize' value must be >= 0, actual value '-1'", IDL),
    Row("find sort not an object", find({}, sort=1), 14, "TypeMismatch",
        "BSON field 'find.sort' is the wrong type 'int', expected type 'object'", IDL),
    Row("find sort by 2", find({}, sort={"a": 2}), 15975, "Location15975",
        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
        "src: db/query/sort_pattern.cpp"),
    Row("find projection mixes", find({}, projection={"a": 1, "s": 0}), 31254, "Location31254",
        "Cannot do exclusion on field s in inclusion projection",
        "src: db/query/projection_parser.cpp"),
    Row("find batchSize not a number", find({}, batchSize="x"), 14, "TypeMismatch",
        "BSON field 'find.batchSize' is the wrong type 'string', expected types "
        "'[long, int, decimal, double]'", IDL),
    Row("unknown command", {"fooBar": 1}, 59, "CommandNotFound", "no such command: 'fooBar'",
        "src: db/service_entry_point_common.cpp"),
    Row("getMore unknown cursor", {"getMore": 12345, "collection": "c"}, 43, "CursorNotFound",
        "cursor id 12345 not found", "src: db/commands/getmore_cmd.cpp"),
    Row("count query not an object", {"count": "c", "query": 1}, 14, "TypeMismatch",
        "BSON field 'count.query' is the wrong type 'int', expected type 'object'", IDL),
    Row("distinct key not a string", {"distinct": "c", "key": 1}, 14, "TypeMismatch",
        "BSON field 'distinct.key' is the wrong type 'int', expected type 'string'", IDL),
    Row("distinct without key", {"distinct": "c"}, 40414, "Location40414",
        "BSON field 'distinct.key' is missing but a required field", IDL),
    Row("insert without documents", {"insert": "c"}, 40414, "Location40414",
        "BSON field 'insert.documents' is missing but a required field", IDL),
    Row("update without updates", {"update": "c"}, 40414, "Location40414",
        "BSON field 'update.updates' is missing but a required field", IDL),
    Row("delete without deletes", {"delete": "c"}, 40414, "Location40414",
        "BSON field 'delete.deletes' is missing but a required field", IDL),
    Row("aggregate without pipeline", {"aggregate": "c", "cursor": {}}, 40414, "Location40414",
        "BSON field 'aggregate.pipeline' is missing but a required field", IDL),
    Row("delete without limit", {"delete": "c", "deletes": [{"q": {}}]}, 40414, "Location40414",
        "BSON field 'delete.deletes.limit' is missing but a required field", IDL),
    Row("delete limit 2", {"delete": "c", "deletes": [{"q": {}, "limit": 2}]}, 9, "FailedToParse",
        "The limit field in delete objects must be 0 or 1. Got 2",
        "src: db/ops/write_ops.cpp"),
    Row("aggregate without cursor", {"aggregate": "c", "pipeline": []}, 9, "FailedToParse",
        "The 'cursor' option is required, except for aggregate with the explain argument",
        "src: db/pipeline/aggregation_request_helper.cpp"),
    Row("aggregate pipeline not an array", {"aggregate": "c", "pipeline": 1, "cursor": {}}, 14,
        "TypeMismatch",
        "BSON field 'aggregate.pipeline' is the wrong type 'int', expected type 'array'", IDL),
    Row("create empty name", {"create": ""}, 73, "InvalidNamespace",
        "Invalid namespace specified '{db}.'", "src: db/commands/dbcommands.cpp"),
    Row("renameCollection onto existing", None, 48, "NamespaceExists",
        "target namespace exists", "src: db/catalog/rename_collection.cpp"),
    Row("find collection name not a string", {"find": 1}, 73, "InvalidNamespace",
        "collection name has invalid type int", "src: db/namespace_string.cpp"),
    # ------------------------------------------------ update operators
    Row("unknown update operator", update({"$foo": {"a": 1}}), 9, "FailedToParse",
        "Unknown modifier: $foo. Expected a valid update modifier or pipeline-style update "
        "specified as an array", UPD + "update_driver.cpp"),
    Row("$set not a document", update({"$set": 1}), 9, "FailedToParse",
        "Modifiers operate on fields but we found type int instead. For example: "
        "{$mod: {<field>: ...}} not {$set: 1}", UPD + "update_driver.cpp"),
    Row("$inc by a string", update({"$inc": {"a": "x"}}), 14, "TypeMismatch",
        "Cannot increment with non-numeric argument: {a: \"x\"}", UPD + "arithmetic_node.cpp"),
    Row("$mul by a string", update({"$mul": {"a": "x"}}), 14, "TypeMismatch",
        "Cannot multiply with non-numeric argument: {a: \"x\"}", UPD + "arithmetic_node.cpp"),
    Row("$inc on a string", update({"$inc": {"s": 1}}), 14, None,
        "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 's' of "
        "non-numeric type string", UPD + "arithmetic_node.cpp"),
    Row("conflicting paths", update({"$set": {"a": 1}, "$inc": {"a": 1}}), 40,
        "ConflictingUpdateOperators", "Updating the path 'a' would create a conflict at 'a'",
        UPD + "update_object_node.cpp"),
    Row("conflicting parent path", update({"$set": {"sub": 1, "sub.x": 2}}), 40,
        "ConflictingUpdateOperators", "Updating the path 'sub.x' would create a conflict at 'sub'",
        UPD + "update_object_node.cpp"),
    Row("empty update path", update({"$set": {"": 1}}), 56, "EmptyFieldName",
        "An empty update path is not valid.", UPD + "update_object_node.cpp"),
    Row("empty path component", update({"$set": {"a..b": 1}}), 56, "EmptyFieldName",
        "The update path 'a..b' contains an empty field name, which is not allowed.",
        UPD + "update_object_node.cpp"),
    Row("modify _id", update({"$set": {"_id": 5}}), 66, None,
        "Performing an update on the path '_id' would modify the immutable field '_id'",
        UPD + "update_object_node.cpp"),
    Row("$push on a non-array", update({"$push": {"a": 1}}), 2, None,
        "The field 'a' must be an array but is of type int in document {_id: 1}",
        UPD + "push_node.cpp"),
    Row("$addToSet on a non-array", update({"$addToSet": {"a": 1}}), 2, None,
        "Cannot apply $addToSet to non-array field. Field named 'a' has non-array type int",
        UPD + "addtoset_node.cpp"),
    Row("$pull on a non-array", update({"$pull": {"a": 1}}), 2, None,
        "Cannot apply $pull to a non-array value", UPD + "array_culling_node.cpp"),
    Row("$pop by 2", update({"$pop": {"arr": 2}}), 9, "FailedToParse",
        "$pop expects 1 or -1, found: 2", UPD + "pop_node.cpp"),
    Row("$pop on a non-array", update({"$pop": {"a": 1}}), 14, None,
        "Path 'a' contains an element of non-array type 'int'", UPD + "pop_node.cpp"),
    Row("$rename to a non-string", update({"$rename": {"a": 1}}), 2, "BadValue",
        "The 'to' field for $rename must be a string: a: 1", UPD + "rename_node.cpp"),
    Row("$rename onto itself", update({"$rename": {"a": "a"}}), 2, "BadValue",
        "The source and target field for $rename must differ: a: \"a\"", UPD + "rename_node.cpp"),
    Row("$rename onto a parent", update({"$rename": {"sub.x": "sub"}}), 2, "BadValue",
        "The source and target field for $rename must not be on the same path: sub.x: \"sub\"",
        UPD + "rename_node.cpp"),
    Row("$set through a scalar", update({"$set": {"a.b": 1}}), 28, None,
        "Cannot create field 'b' in element {a: 1}", UPD + "modifier_node.cpp"),
    Row("missing array filter", update({"$set": {"arr.$[x]": 1}}), 2, "BadValue",
        "No array filter found for identifier 'x' in path 'arr.$[x]'",
        UPD + "update_array_node.cpp"),
    Row("unused array filter", update({"$set": {"a": 1}}, arrayFilters=[{"x": 1}]), 9,
        "FailedToParse",
        "The array filter for identifier 'x' was not used in the update { $set: { a: 1 } }",
        UPD + "update_driver.cpp"),
    Row("positional $ without a match", update({"$set": {"arr.$": 1}}, q={"_id": 1}), 2, None,
        "The positional operator did not find the match needed from the query.",
        UPD + "update_array_node.cpp"),
    Row("$bit not an object", update({"$bit": {"a": 1}}), 2, "BadValue",
        "The $bit modifier is not compatible with a int. You must pass in an embedded document: "
        "{$bit: {field: {and/or/xor: #}}", UPD + "bit_node.cpp"),
    Row("$bit unknown operation", update({"$bit": {"a": {"nand": 1}}}), 2, "BadValue",
        "The $bit modifier only supports 'and', 'or', and 'xor', not 'nand' which is an "
        "unknown operator: {nand: 1}", UPD + "bit_node.cpp"),
    Row("pipeline update unknown stage", update([{"$match": {}}]), 72, "InvalidOptions",
        "$match is not allowed to be used within an update",
        "src: db/update/pipeline_executor.cpp"),
    # ------------------------------------------------ aggregation stages
    Row("unknown stage", agg({"$foo": 1}), 40324, "Location40324",
        "Unrecognized pipeline stage name: '$foo'", "src: db/pipeline/document_source.cpp"),
    Row("stage with two fields", agg({"$match": {}, "$limit": 1}), 40323, "Location40323",
        "A pipeline stage specification object must contain exactly one field.",
        "src: db/pipeline/document_source.cpp"),
    Row("$limit zero", agg({"$limit": 0}), 15958, "Location15958",
        "the limit must be positive", STAGE),
    Row("$limit not a number", agg({"$limit": "x"}), 15957, "Location15957",
        "the limit must be specified as a number", STAGE),
    Row("$skip negative", agg({"$skip": -1}), 5107200, "Location5107200",
        "invalid argument to $skip stage: Expected a non-negative number in: $skip: -1", STAGE),
    Row("$skip not a number", agg({"$skip": "x"}), 5107200, "Location5107200",
        "invalid argument to $skip stage: Expected a number in: $skip: \"x\"", STAGE),
    Row("$sort empty", agg({"$sort": {}}), 15976, "Location15976",
        "$sort stage must have at least one sort key", "src: db/query/sort_pattern.cpp"),
    Row("$sort by 2", agg({"$sort": {"a": 2}}), 15975, "Location15975",
        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
        "src: db/query/sort_pattern.cpp"),
    Row("$sort not an object", agg({"$sort": 1}), 15973, "Location15973",
        "the $sort key specification must be an object", STAGE),
    Row("$group without _id", agg({"$group": {"x": {"$sum": 1}}}), 15955, "Location15955",
        "a group specification must include an _id", STAGE),
    Row("$group unknown accumulator", agg({"$group": {"_id": 1, "x": {"$foo": 1}}}), 15952,
        "Location15952", "unknown group operator '$foo'", "src: db/pipeline/accumulator.cpp"),
    Row("$group field not an accumulator", agg({"$group": {"_id": 1, "x": 1}}), 40234,
        "Location40234", "The field 'x' must be an accumulator object",
        "src: db/pipeline/accumulation_statement.cpp"),
    Row("$group two accumulators", agg({"$group": {"_id": 1, "x": {"$sum": 1, "$avg": 1}}}),
        40238, "Location40238", "The field 'x' must specify one accumulator",
        "src: db/pipeline/accumulation_statement.cpp"),
    Row("$group dotted field", agg({"$group": {"_id": 1, "a.b": {"$sum": 1}}}), 40235,
        "Location40235", "The field name 'a.b' cannot contain '.'", STAGE),
    Row("$group not an object", agg({"$group": 1}), 15947, "Location15947",
        "a group's fields must be specified in an object", STAGE),
    Row("$project mixes", agg({"$project": {"a": 1, "s": 0}}), 31254, "Location31254",
        "Invalid $project :: caused by :: Cannot do exclusion on field s in inclusion projection",
        "src: db/query/projection_parser.cpp"),
    Row("$set not an object", agg({"$set": 1}), 40272, "Location40272",
        "$set specification stage must be an object, got int", STAGE),
    Row("$addFields not an object", agg({"$addFields": "x"}), 40272, "Location40272",
        "$addFields specification stage must be an object, got string", STAGE),
    Row("$project not an object", agg({"$project": 1}), 15969, "Location15969",
        "$project specification must be an object", STAGE),
    Row("$unwind not a string", agg({"$unwind": 1}), 15981, "Location15981",
        "expected either a string or an object as specification for $unwind stage, got int",
        STAGE),
    Row("$unwind without $", agg({"$unwind": "arr"}), 28818, "Location28818",
        "path option to $unwind stage should be prefixed with a '$': arr", STAGE),
    Row("$match not an object", agg({"$match": 1}), 15959, "Location15959",
        "the match filter must be an expression in an object", STAGE),
    Row("$count empty", agg({"$count": ""}), 40157, "Location40157",
        "the count field must be a non-empty string", STAGE),
    Row("$count dotted", agg({"$count": "a.b"}), 40160, "Location40160",
        "the count field cannot contain '.'", STAGE),
    Row("$count with $", agg({"$count": "$a"}), 40158, "Location40158",
        "the count field cannot be a $-prefixed path", STAGE),
    Row("$out not last", agg({"$out": "o"}, {"$limit": 1}), 40601, "Location40601",
        "$out can only be the final stage in the pipeline", "src: db/pipeline/pipeline.cpp"),
    Row("$sample negative size", agg({"$sample": {"size": -1}}), 28747, "Location28747",
        "size argument to $sample must not be negative", STAGE),
    Row("$sample without size", agg({"$sample": {}}), 28749, "Location28749",
        "$sample stage must specify a size", STAGE),
    Row("$sample not an object", agg({"$sample": 5}), 28745, "Location28745",
        "the $sample stage specification must be an object", STAGE),
    Row("$sample size not a number", agg({"$sample": {"size": "x"}}), 28746, "Location28746",
        "size argument to $sample must be a number", STAGE),
    Row("$geoNear not first", agg({"$limit": 1}, {"$geoNear": {"near": [0, 0],
                                                              "distanceField": "d"}}),
        40603, "Location40603", "$geoNear was not the first stage in the pipeline.",
        "src: db/pipeline/document_source_geo_near.cpp"),
    Row("$out inside $facet", agg({"$facet": {"f": [{"$out": "o"}]}}), 40600, "Location40600",
        "$out is not allowed to be used within a $facet stage", STAGE),
    Row("$text not in the first $match", agg({"$limit": 1}, {"$match": {"$text": {"$search": "x"}}}),
        17313, "Location17313", "$match with $text is only allowed as the first pipeline stage",
        STAGE),
    Row("$bucket without boundaries", agg({"$bucket": {"groupBy": "$a"}}), 40198,
        "Location40198", "$bucket requires 'groupBy' and 'boundaries' to be specified.", STAGE),
    Row("$replaceRoot to a missing field", agg({"$replaceRoot": {"newRoot": "$nope"}}), 40228,
        "Location40228",
        "PlanExecutor error during aggregation :: caused by :: "
        "'newRoot' expression  must evaluate to an object, but resulting value was: MISSING. "
        "Type of resulting value: 'missing'. Input document: {_id: 1, a: 1, s: \"str\", "
        "arr: [1, 2], sub: {x: 1}, n: null}", STAGE),
    Row("$redact bad answer", agg({"$redact": "$s"}), 17053, "Location17053",
        "PlanExecutor error during aggregation :: caused by :: $redact's expression should not return anything aside from the variables $$KEEP, "
        "$$DESCEND, and $$PRUNE, but returned \"str\"", STAGE),
    # ------------------------------------------------ expressions
    # Where a projection value may be an expression, MongoDB's projection
    # parser answers (FerretDB's integration tests record the same words
    # from MongoDB); inside an expression, the expression parser does.
    Row("unknown expression", project({"$foo": 1}), 31325, "Location31325",
        "Invalid $project :: caused by :: Unknown expression $foo",
        "src: db/query/projection_parser.cpp"),
    Row("unknown nested expression", project({"$add": [{"$foo": 1}]}), 168,
        "InvalidPipelineOperator",
        "Invalid $project :: caused by :: Unrecognized expression '$foo'", EXPR),
    Row("$add of a string", project({"$add": ["$s", 1]}), 14, "TypeMismatch",
        "PlanExecutor error during aggregation :: caused by :: $add only supports numeric or "
        "date types, not string", EXPR),
    Row("$subtract of a string", project({"$subtract": ["$s", 1]}), 14, "TypeMismatch",
        "PlanExecutor error during aggregation :: caused by :: can't $subtract int from string",
        EXPR),
    Row("$multiply of a string", project({"$multiply": ["$s", 2]}), 14, "TypeMismatch",
        "PlanExecutor error during aggregation :: caused by :: $multiply only supports "
        "numeric types, not string", EXPR),
    Row("$divide by zero", project({"$divide": ["$a", 0]}), 2, "BadValue",
        "PlanExecutor error during aggregation :: caused by :: can't $divide by zero", EXPR),
    Row("$divide of a string", project({"$divide": ["$s", 1]}), 14, "TypeMismatch",
        "PlanExecutor error during aggregation :: caused by :: $divide only supports numeric "
        "types, not string and int", EXPR),
    Row("$mod expression by zero", project({"$mod": ["$a", 0]}), 16610, "Location16610",
        "PlanExecutor error during aggregation :: caused by :: can't $mod by zero", EXPR),
    Row("$concat of a number", project({"$concat": ["$s", "$a"]}), 16702, "Location16702",
        "PlanExecutor error during aggregation :: caused by :: $concat only supports strings, "
        "not int", EXPR),
    Row("$size of a non-array", project({"$size": "$s"}), 17124, "Location17124",
        "PlanExecutor error during aggregation :: caused by :: The argument to $size must be "
        "an array. Type of the argument was: string", EXPR),
    Row("$arrayElemAt of a non-array", project({"$arrayElemAt": ["$a", 0]}), 28689,
        "Location28689",
        "PlanExecutor error during aggregation :: caused by :: $arrayElemAt's first argument "
        "must be an array, but is int", EXPR),
    Row("wrong arity", project({"$toUpper": ["$s", "$s"]}), 16020, "Location16020",
        "Invalid $project :: caused by :: Expression $toUpper takes exactly 1 arguments. "
        "2 were passed in.", EXPR),
    Row("$cond arity", project({"$cond": [1]}), 16020, "Location16020",
        "Invalid $project :: caused by :: Expression $cond takes exactly 3 arguments. "
        "1 were passed in.", EXPR),
    Row("$cond without then", project({"$cond": {"if": True}}), 17081, "Location17081",
        "Invalid $project :: caused by :: Missing 'then' parameter to $cond", EXPR),
    Row("$cond unknown parameter", project({"$cond": {"if": 1, "then": 1, "else": 1, "x": 1}}),
        17083, "Location17083", "Invalid $project :: caused by :: Unrecognized parameter to "
        "$cond: x", EXPR),
    Row("$switch without branches", project({"$switch": {}}), 40068, "Location40068",
        "Invalid $project :: caused by :: $switch requires at least one branch.", EXPR),
    Row("$switch no match", project({"$switch": {"branches": [{"case": False, "then": 1}]}}),
        40066, "Location40066",
        "PlanExecutor error during aggregation :: caused by :: $switch could not find a "
        "matching branch for an input, and no default was specified.", EXPR),
    Row("undefined variable", project("$$nope"), 17276, "Location17276",
        "Invalid $project :: caused by :: Use of undefined variable: nope",
        "src: db/pipeline/variables.cpp"),
    Row("bad variable name", project({"$let": {"vars": {"X": 1}, "in": 1}}), 16867,
        "Location16867",
        "Invalid $project :: caused by :: 'X' starts with an invalid character for a user "
        "variable name", "src: db/pipeline/variable_validation.cpp"),
    Row("$toInt of a bad string", project({"$toInt": "$s"}), 241, "ConversionFailure",
        "PlanExecutor error during aggregation :: caused by :: Failed to parse number 'str' "
        "in $convert with no onError value: Did not consume whole string.",
        "src: db/pipeline/expression_convert.cpp"),
    Row("$convert unknown type", project({"$convert": {"input": 1, "to": "foo"}}), 2,
        "BadValue",
        "PlanExecutor error during aggregation :: caused by :: Unknown type name: foo",
        "src: db/pipeline/expression_convert.cpp"),
    Row("$in of a non-array", project({"$in": [1, "$a"]}), 40081, "Location40081",
        "PlanExecutor error during aggregation :: caused by :: $in requires an array as a "
        "second argument, found: int", EXPR),
    Row("$split of a number", project({"$split": ["$a", "x"]}), 40085, "Location40085",
        "PlanExecutor error during aggregation :: caused by :: $split requires an expression "
        "that evaluates to a string as a first argument, found: int", EXPR),
    Row("$filter of a non-array", project({"$filter": {"input": "$a", "cond": True}}), 28651,
        "Location28651", "PlanExecutor error during aggregation :: caused by :: input to "
        "$filter must be an array not int", EXPR),
    Row("$map of a non-array", project({"$map": {"input": "$a", "in": 1}}), 16883,
        "Location16883", "PlanExecutor error during aggregation :: caused by :: input to "
        "$map must be an array not int", EXPR),
    Row("$objectToArray of a number", project({"$objectToArray": "$a"}), 40390,
        "Location40390", "PlanExecutor error during aggregation :: caused by :: "
        "$objectToArray requires a document input, found: int", EXPR),
    Row("$arrayToObject of a number", project({"$arrayToObject": "$a"}), 40386,
        "Location40386", "PlanExecutor error during aggregation :: caused by :: "
        "$arrayToObject requires an array input, found: int", EXPR),
    Row("$regexMatch of a number", project({"$regexMatch": {"input": "$a", "regex": "x"}}),
        51104, "Location51104", "PlanExecutor error during aggregation :: caused by :: "
        "$regexMatch needs 'input' to be of type string", EXPR),
    Row("$sqrt of a negative", project({"$sqrt": {"$subtract": [0, "$a"]}}), 28714,
        "Location28714", "PlanExecutor error during aggregation :: caused by :: $sqrt's argument must be greater than or equal to 0",
        EXPR),
    Row("$range of a string", project({"$range": [0, "$s"]}), 34445, "Location34445",
        "PlanExecutor error during aggregation :: caused by :: $range requires a numeric "
        "ending value, found value of type: string", EXPR),
    Row("index without key", create_index({"name": "x"}), 9, "FailedToParse",
        "Error in specification { name: \"x\" } :: caused by :: The 'key' field is a required "
        "property of an index specification", IDX),
    Row("index with empty key", create_index({"key": {}, "name": "x"}), 67, "CannotCreateIndex",
        "Error in specification { key: {}, name: \"x\" } :: caused by :: Index keys cannot be "
        "empty.", IDX),
    Row("index of an unknown kind", create_index({"key": {"a": "foo"}, "name": "x"}), 67,
        "CannotCreateIndex", "Error in specification { key: { a: \"foo\" }, name: \"x\" } :: "
        "caused by :: Unknown index plugin 'foo'", IDX),
    Row("index unknown option", create_index({"key": {"a": 1}, "name": "x", "foo": 1}), 197,
        "InvalidIndexSpecificationOption",
        "Error in specification { key: { a: 1 }, name: \"x\", foo: 1 } :: caused by :: "
        "The field 'foo' is not valid for an index specification. Specification: "
        "{ key: { a: 1 }, name: \"x\", foo: 1 }", IDX),
    Row("no index to create", create_index(), 2, "BadValue",
        "Must specify at least one index to create", "src: db/commands/create_indexes_cmd.cpp"),
    Row("same keys, other name", None, 85, "IndexOptionsConflict",
        "Index already exists with a different name: a_1", "src: db/catalog/index_catalog_impl.cpp"),
    Row("same name, other keys", None, 86, "IndexKeySpecsConflict",
        "An existing index has the same name as the requested index. When index names are not "
        "specified, they are auto generated and can cause conflicts. Please refer to our "
        "documentation. Requested index: { v: 2, key: { s: 1 }, name: \"a_1\" }, existing "
        "index: { v: 2, key: { a: 1 }, name: \"a_1\" }", "src: db/catalog/index_catalog_impl.cpp"),
    Row("drop a missing index", {"dropIndexes": "c", "index": "nope"}, 27, "IndexNotFound",
        "index not found with name [nope]", "src: db/catalog/drop_indexes.cpp"),
    Row("drop the _id index", {"dropIndexes": "c", "index": "_id_"}, 72, "InvalidOptions",
        "cannot drop _id index", "src: db/catalog/drop_indexes.cpp"),
    # ------------------------------------------------ write errors
    Row("duplicate _id", {"insert": "c", "documents": [{"_id": 1}]}, 11000, None,
        "E11000 duplicate key error collection: {db}.c index: _id_ dup key: { _id: 1 }",
        "src: db/storage/duplicate_key_error_info.cpp"),
    Row("array _id", {"insert": "c", "documents": [{"_id": [1]}]}, 53, None,
        "The '_id' value cannot be of type array", "src: db/ops/insert.cpp"),
    Row("regex _id", {"insert": "c", "documents": [{"_id": Regex("^a")}]}, 53, None,
        "The '_id' value cannot be of type regex", "src: db/storage/storage_validation.cpp"),
    Row("empty insert batch", {"insert": "c", "documents": []}, 16, "InvalidLength",
        "Write batch sizes must be between 1 and 100000. Got 0 operations.",
        "src: db/ops/write_ops.cpp"),
    Row("unique index violation", None, 11000, None,
        "E11000 duplicate key error collection: {db}.c index: s_1 dup key: { s: \"str\" }",
        "src: db/storage/duplicate_key_error_info.cpp"),
]

# Rows whose command depends on state a setup step makes.
SETUP = {
    "renameCollection onto existing": (
        lambda db: db.create_collection("d"),
        lambda db: {"renameCollection": f"{db.name}.c", "to": f"{db.name}.d"},
    ),
    "same keys, other name": (
        lambda db: db.c.create_index("a"),
        lambda db: create_index({"key": {"a": 1}, "name": "other"}),
    ),
    "same name, other keys": (
        lambda db: db.c.create_index("a"),
        lambda db: create_index({"key": {"s": 1}, "name": "a_1"}),
    ),
    "unique index violation": (
        lambda db: db.c.create_index("s", unique=True),
        lambda db: {"insert": "c", "documents": [{"_id": 9, "s": "str"}]},
    ),
}

ADMIN = {"renameCollection onto existing"}


def outcome(db, row):
    """(code, codeName, errmsg) of the row's command: the command's error,
    else its first write error."""
    cmd = row.cmd
    if row.name in SETUP:
        setup, make = SETUP[row.name]
        setup(db)
        cmd = make(db)
    target = db.client.admin if row.name in ADMIN else db
    reply = target.command(cmd, check=False)
    if reply.get("ok") != 1:
        return reply.get("code"), reply.get("codeName"), reply.get("errmsg")
    errors = reply.get("writeErrors") or []
    if errors:
        e = errors[0]
        return e.get("code"), e.get("codeName"), e.get("errmsg")
    return None, None, f"succeeded: {reply}"


def test_the_table_is_large_enough():
    assert len(ROWS) >= 100
    assert len({r.name for r in ROWS}) == len(ROWS)


def slug(i, name):
    return f"{i:03d}_" + "".join(ch if ch.isalnum() else "_" for ch in name)


@pytest.mark.parametrize("row", ROWS, ids=[slug(i, r.name) for i, r in enumerate(ROWS)])
def test_error(db, row):
    db.c.insert_many(DOCS)
    code, name, msg = outcome(db, row)
    want = (row.code, row.code_name, row.msg.replace("{db}", db.name))
    got = (code, name if row.code_name is not None else None, msg)
    assert got == want, f"{row.name} ({row.src})"
