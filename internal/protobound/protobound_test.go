package protobound

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// list is a structpb.Value holding a list of n values, each a list of m numbers: 1 list
// + n x (value, list) + n x m values nested in the outer value.
func list(t *testing.T, n, m int) []byte {
	t.Helper()
	outer := &structpb.ListValue{}
	for range n {
		inner := &structpb.ListValue{}
		for range m {
			inner.Values = append(inner.Values, structpb.NewNumberValue(1))
		}
		outer.Values = append(outer.Values, structpb.NewListValue(inner))
	}
	b, err := proto.Marshal(structpb.NewListValue(outer))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var valueType = (&structpb.Value{}).ProtoReflect().Descriptor()

func TestCostCountsEveryMessage(t *testing.T) {
	for _, c := range []struct{ n, m, want int }{{0, 0, 1}, {1, 0, 3}, {3, 2, 1 + 3*2 + 3*2}, {10, 10, 1 + 20 + 100}} {
		got, err := Cost(list(t, c.n, c.m), valueType, 1000)
		if err != nil || got != c.want {
			t.Errorf("%d lists of %d: Cost = %d, %v; want %d", c.n, c.m, got, err, c.want)
		}
	}
}

func TestCostRefusesPastTheLimit(t *testing.T) {
	b := list(t, 10, 10) // 121 messages
	if _, err := Cost(b, valueType, 121); err != nil {
		t.Fatalf("121 messages within 121: %v", err)
	}
	if _, err := Cost(b, valueType, 120); !errors.Is(err, ErrTooMany) {
		t.Fatalf("121 messages within 120: %v, want ErrTooMany", err)
	}
}

// Empty nested messages are the cheapest on the wire, two bytes each.
func TestCostCountsEmptyMessages(t *testing.T) {
	listValues := valueType.Fields().ByName("list_value").Number()
	values := (&structpb.ListValue{}).ProtoReflect().Descriptor().Fields().ByName("values").Number()
	var inner []byte
	for range 5000 {
		inner = protowire.AppendTag(inner, values, protowire.BytesType)
		inner = protowire.AppendBytes(inner, nil)
	}
	b := protowire.AppendTag(nil, listValues, protowire.BytesType)
	b = protowire.AppendBytes(b, inner)
	if got, err := Cost(b, valueType, 1<<20); err != nil || got != 5001 {
		t.Fatalf("Cost = %d, %v; want 5001", got, err)
	}
}

func TestCostSkipsUnknownAndScalarFields(t *testing.T) {
	b := protowire.AppendTag(nil, 99, protowire.BytesType) // unknown to Value: kept as bytes
	b = protowire.AppendBytes(b, list(t, 3, 3))
	b = protowire.AppendTag(b, valueType.Fields().ByName("string_value").Number(), protowire.BytesType)
	b = protowire.AppendString(b, "x")
	if got, err := Cost(b, valueType, 10); err != nil || got != 0 {
		t.Fatalf("Cost = %d, %v; want 0", got, err)
	}
}

func TestCostRefusesWhatDoesNotDecode(t *testing.T) {
	b := list(t, 2, 2)
	for _, bad := range [][]byte{b[:len(b)-1], append([]byte{0xff}, b...), {0x0a, 0x80}} {
		if _, err := Cost(bad, valueType, 1000); !errors.Is(err, ErrInvalid) {
			t.Errorf("Cost(%x) = %v, want ErrInvalid", bad, err)
		}
	}
}

// Value and ListValue nest each other: a file can nest them as deep as it is long.
func TestCostRefusesNestingDeeperThanProtobuf(t *testing.T) {
	listValues := valueType.Fields().ByName("list_value").Number()
	values := (&structpb.ListValue{}).ProtoReflect().Descriptor().Fields().ByName("values").Number()
	var b []byte
	for range protowire.DefaultRecursionLimit {
		b = protowire.AppendBytes(protowire.AppendTag(nil, values, protowire.BytesType), b)
		b = protowire.AppendBytes(protowire.AppendTag(nil, listValues, protowire.BytesType), b)
	}
	if _, err := Cost(b, valueType, 1<<30); err == nil || errors.Is(err, ErrTooMany) {
		t.Fatalf("nesting %d deep: %v, want it refused as too deep", 2*protowire.DefaultRecursionLimit, err)
	}
}

// An element of a repeated number field decodes to 8 bytes from as little as one packed
// byte, an empty string to a 16-byte header from two: a crafted 256 MiB mm image of packed
// auxv words would have decoded to ~2 GiB. Each element costs an eighth of a message.
func TestCostCountsRepeatedValues(t *testing.T) {
	loc := (&descriptorpb.SourceCodeInfo_Location{}).ProtoReflect().Descriptor()
	path := loc.Fields().ByName("path").Number() // repeated int32, packed
	var packed []byte
	for range 8000 {
		packed = append(packed, 1) // one-byte varints
	}
	b := protowire.AppendBytes(protowire.AppendTag(nil, path, protowire.BytesType), packed)
	for range 80 { // and unpacked: one per occurrence
		b = protowire.AppendVarint(protowire.AppendTag(b, path, protowire.VarintType), 1)
	}
	if got, err := Cost(b, loc, 1<<20); err != nil || got != 1010 {
		t.Fatalf("8080 numbers: Cost = %d, %v; want 1010", got, err)
	}
	if _, err := Cost(b, loc, 1009); !errors.Is(err, ErrTooMany) {
		t.Fatalf("8080 numbers within 1009: %v, want ErrTooMany", err)
	}
	mask := (&fieldmaskpb.FieldMask{}).ProtoReflect().Descriptor()
	var strs []byte
	for range 800 {
		strs = protowire.AppendString(protowire.AppendTag(strs, mask.Fields().ByName("paths").Number(), protowire.BytesType), "")
	}
	if got, err := Cost(strs, mask, 1<<20); err != nil || got != 100 {
		t.Fatalf("800 empty strings: Cost = %d, %v; want 100", got, err)
	}
}
