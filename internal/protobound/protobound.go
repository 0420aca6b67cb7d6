// Package protobound bounds what decoding a protobuf message from an untrusted file costs.
//
// A decoded message costs a Go struct (about a hundred bytes or more) however few bytes it
// took on the wire: an empty nested message is two bytes, so a crafted 64 MiB CRIU image of
// empty nested messages decoded to ~4.7 GB. An element of a repeated scalar field costs
// eight bytes from as little as one. Counting what a decode would make, before decoding,
// lets a reader refuse such input at the cost of one pass over the bytes.
package protobound

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Errors of Cost: the encoded message costs more than allowed, or its bytes are not a
// protobuf encoding (truncated ones included: a decoder would refuse them).
var (
	ErrTooMany = errors.New("more nested messages and repeated values than gpucr decodes")
	ErrInvalid = errors.New("cannot parse invalid wire-format data")
)

// elementsPerUnit is how many elements of repeated fields cost as much as one message: an
// element decodes to 8 bytes (a number, or a slice's share of a string's header and more).
const elementsPerUnit = 8

// Cost is what decoding b, the encoding of a message of type md, makes, in messages: each
// message nested in it at any depth counts one (md's own not counted), and each element of a
// repeated field of numbers, strings or bytes an eighth. It fails with ErrTooMany past
// limit. Map entries and groups count as messages; fields md does not know are kept as
// bytes by a decoder and are not counted. Nesting deeper than protobuf's own recursion
// limit is refused, as the decoder would refuse it.
func Cost(b []byte, md protoreflect.MessageDescriptor, limit int) (int, error) {
	c := counter{left: limit}
	if err := c.message(b, md, 0); err != nil {
		return 0, err
	}
	return limit - c.left, nil
}

// counter charges what it finds to left; elements holds repeated values not yet a unit.
type counter struct{ left, elements int }

// charge takes n units.
func (c *counter) charge(n int) error {
	if n > c.left {
		return ErrTooMany
	}
	c.left -= n
	return nil
}

// message counts what b, of type md at the given depth, makes.
func (c *counter) message(b []byte, md protoreflect.MessageDescriptor, depth int) error {
	if depth >= protowire.DefaultRecursionLimit {
		return errors.New("messages nested deeper than protobuf decodes")
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w (%v)", ErrInvalid, protowire.ParseError(n))
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return fmt.Errorf("%w (%v)", ErrInvalid, protowire.ParseError(n))
		}
		value := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		switch {
		case fd == nil:
			continue
		case fd.Message() == nil:
			if fd.IsList() {
				c.elements += elements(fd.Kind(), typ, value)
				if err := c.charge(c.elements / elementsPerUnit); err != nil {
					return err
				}
				c.elements %= elementsPerUnit
			}
			continue
		}
		if err := c.charge(1); err != nil {
			return err
		}
		switch typ {
		case protowire.BytesType:
			v, _ := protowire.ConsumeBytes(value)
			if err := c.message(v, fd.Message(), depth+1); err != nil {
				return err
			}
		case protowire.StartGroupType:
			v, _ := protowire.ConsumeGroup(num, value)
			if err := c.message(v, fd.Message(), depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// elements is how many values of a repeated field of kind one occurrence, value, holds:
// several when numbers come packed, one otherwise.
func elements(kind protoreflect.Kind, typ protowire.Type, value []byte) int {
	if typ != protowire.BytesType || kind == protoreflect.StringKind || kind == protoreflect.BytesKind {
		return 1
	}
	packed, _ := protowire.ConsumeBytes(value)
	switch kind {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(packed) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(packed) / 8
	}
	n := 0
	for _, x := range packed {
		if x < 0x80 {
			n++ // the last byte of a varint
		}
	}
	return n
}
