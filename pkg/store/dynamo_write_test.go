package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// scriptedTransactions answers TransactWriteItems from a script and keeps
// what it was sent. dynalite has no TransactWriteItems, so this unit test
// is what checks how Write reads DynamoDB's cancellation reasons; the ops'
// expressions were run against a server that has it (docs/storage.md).
type scriptedTransactions struct {
	DynamoAPI
	answers []error
	sent    []*dynamodb.TransactWriteItemsInput
}

func (s *scriptedTransactions) TransactWriteItems(_ context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	s.sent = append(s.sent, in)
	if len(s.answers) == 0 {
		return &dynamodb.TransactWriteItemsOutput{}, nil
	}
	err := s.answers[0]
	s.answers = s.answers[1:]
	return nil, err
}

func canceled(codes ...string) error {
	e := &types.TransactionCanceledException{}
	for _, c := range codes {
		e.CancellationReasons = append(e.CancellationReasons, types.CancellationReason{Code: aws.String(c)})
	}
	return e
}

func TestWriteReadsCancellationReasons(t *testing.T) {
	ops := []Op{
		PutOp("t", Item{Key: Key{PK: "p", SK: "req"}}, IfNotExists()),
		AddOp("t", Key{PK: "p", SK: "count"}, 1, time.Time{}),
	}
	tests := []struct {
		name    string
		answers []error
		want    error
		calls   int
		// lastAdd is how the add goes out in the last call: "update" or
		// "put" (a fresh counter).
		lastAdd string
	}{
		{"committed at once", nil, nil, 1, "update"},
		{"no counter yet: created fresh", []error{canceled("None", "ConditionalCheckFailed")}, nil, 2, "put"},
		{"created meanwhile: updated after all", []error{canceled("None", "ConditionalCheckFailed"), canceled("None", "ConditionalCheckFailed")}, nil, 3, "update"},
		{"the caller's condition failed", []error{canceled("ConditionalCheckFailed", "None")}, ErrConditionFailed, 1, "update"},
		{"a concurrent transaction", []error{canceled("None", "TransactionConflict")}, nil, 2, "update"},
		{"throttled", []error{canceled("None", "ThrottlingError")}, errAny, 1, "update"},
		{"missing table", []error{&types.ResourceNotFoundException{Message: aws.String("no table")}}, ErrTableNotFound, 1, "update"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &scriptedTransactions{answers: tt.answers}
			out, err := NewDynamo(api, DynamoOptions{}).Write(context.Background(), ops...)
			switch {
			case tt.want == nil && err != nil:
				t.Fatalf("err = %v", err)
			case tt.want == errAny && err == nil, tt.want != nil && tt.want != errAny && !errors.Is(err, tt.want):
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if len(api.sent) != tt.calls {
				t.Fatalf("%d transactions sent, want %d", len(api.sent), tt.calls)
			}
			last := api.sent[len(api.sent)-1].TransactItems
			if got := map[bool]string{true: "update", false: "put"}[last[1].Update != nil]; got != tt.lastAdd {
				t.Errorf("the add went out as %s, want %s", got, tt.lastAdd)
			}
			if last[0].Put == nil || aws.ToString(last[0].Put.ConditionExpression) != absentExpr {
				t.Errorf("the put's condition = %v", last[0].Put)
			}
			if err == nil && out[0].Version != 1 {
				t.Errorf("put version %d, want 1", out[0].Version)
			}
		})
	}
}

var errAny = errors.New("any error")
