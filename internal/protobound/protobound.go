// Package protobound bounds what decoding a protobuf message from an untrusted file costs.
//
// A decoded message costs a Go struct (about a hundred bytes or more) however few bytes it
// took on the wire: an empty nested message is two bytes, so a crafted 64 MiB CRIU image of
// empty nested messages decoded to ~4.7 GB. Counting the messages a decode would make,
// before decoding, lets a reader refuse such input at the cost of one pass over the bytes.
package protobound

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Errors of Nested: the encoded message holds more nested messages than allowed, or its
// bytes are not a protobuf encoding (truncated ones included: a decoder would refuse them).
var (
	ErrTooMany = errors.New("more nested messages than gpucr decodes")
	ErrInvalid = errors.New("cannot parse invalid wire-format data")
)

// Nested counts the messages nested at any depth in b, the encoding of a message of type md
// (md's own message not counted), and fails with ErrTooMany past limit. Map entries and
// groups count as messages; fields md does not know are kept as bytes by a decoder and are
// not counted. Nesting deeper than protobuf's own recursion limit is refused, as the
// decoder would refuse it.
func Nested(b []byte, md protoreflect.MessageDescriptor, limit int) (int, error) {
	c := counter{left: limit}
	if err := c.message(b, md, 0); err != nil {
		return 0, err
	}
	return limit - c.left, nil
}

type counter struct{ left int }

// message counts the messages nested in b, which is of type md at the given depth.
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
		if fd == nil || fd.Message() == nil {
			continue
		}
		if c.left == 0 {
			return ErrTooMany
		}
		c.left--
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
