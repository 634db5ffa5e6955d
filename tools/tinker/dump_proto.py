"""Writes the .proto source of the Tinker SDK's wire schema.

The `tinker` wheel ships only the compiled descriptor of its protobuf
schema (tinker/proto/tinker_public_pb2.py). This prints an equivalent
.proto from that descriptor, so that the server can be built against the
same field numbers:

  python tools/tinker/dump_proto.py > proto/tinker/tinker_public.proto

Needs the pinned SDK (`pip install tinker==0.38.0`).
"""

import sys

from google.protobuf.descriptor import FieldDescriptor as FD

from tinker.proto import tinker_public_pb2

SCALARS = {
    FD.TYPE_DOUBLE: "double", FD.TYPE_FLOAT: "float", FD.TYPE_INT64: "int64",
    FD.TYPE_UINT64: "uint64", FD.TYPE_INT32: "int32", FD.TYPE_BOOL: "bool",
    FD.TYPE_STRING: "string", FD.TYPE_BYTES: "bytes", FD.TYPE_UINT32: "uint32",
    FD.TYPE_SINT32: "sint32", FD.TYPE_SINT64: "sint64",
    FD.TYPE_FIXED32: "fixed32", FD.TYPE_FIXED64: "fixed64",
}


def type_name(field):
    if field.type in (FD.TYPE_MESSAGE, FD.TYPE_ENUM):
        return field.message_type.name if field.message_type else field.enum_type.name
    return SCALARS[field.type]


def is_repeated(field):
    if hasattr(field, "is_repeated"):  # protobuf >= 6
        return field.is_repeated
    return field.label == FD.LABEL_REPEATED


def is_map(field):
    return (field.type == FD.TYPE_MESSAGE and
            field.message_type.GetOptions().map_entry)


def field_line(field, indent):
    if is_map(field):
        key, value = field.message_type.fields
        kind = f"map<{type_name(key)}, {type_name(value)}>"
    else:
        kind = type_name(field)
        if is_repeated(field):
            kind = "repeated " + kind
        elif (field.has_presence and field.type != FD.TYPE_MESSAGE and
              (field.containing_oneof is None or
               not real_oneof(field.containing_oneof))):
            kind = "optional " + kind
    return f"{indent}{kind} {field.name} = {field.number};"


def real_oneof(oneof):
    # proto3 `optional` fields live in a synthetic oneof named _<field>.
    return not (len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name)


def write_enum(enum, indent, out):
    out.append(f"{indent}enum {enum.name} {{")
    for value in enum.values:
        out.append(f"{indent}  {value.name} = {value.number};")
    out.append(f"{indent}}}")


def write_message(message, indent, out):
    out.append(f"{indent}message {message.name} {{")
    inner = indent + "  "
    for nested in message.nested_types:
        if not nested.GetOptions().map_entry:
            write_message(nested, inner, out)
    for enum in message.enum_types:
        write_enum(enum, inner, out)
    done = set()
    for field in message.fields:
        if field.name in done:
            continue
        oneof = field.containing_oneof
        if oneof is not None and real_oneof(oneof):
            out.append(f"{inner}oneof {oneof.name} {{")
            for member in oneof.fields:
                out.append(field_line(member, inner + "  "))
                done.add(member.name)
            out.append(f"{inner}}}")
        else:
            out.append(field_line(field, inner))
    out.append(f"{indent}}}")


def main():
    file = tinker_public_pb2.DESCRIPTOR
    out = [
        "// The Tinker SDK's wire schema, rebuilt from the descriptor in",
        "// tinker==0.38.0 by tools/tinker/dump_proto.py. Do not edit by hand.",
        'syntax = "proto3";',
        "",
        f"package {file.package};",
        "",
    ]
    for enum in file.enum_types_by_name.values():
        write_enum(enum, "", out)
        out.append("")
    for message in file.message_types_by_name.values():
        write_message(message, "", out)
        out.append("")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
