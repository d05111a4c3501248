package testenv

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// AWSConfig is what a service would load, with fixed test credentials (the
// local servers accept any) and nothing read from the environment, so a
// developer's real AWS settings never reach a test.
func AWSConfig() aws.Config {
	return aws.Config{
		Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "testenv"}, nil
		}),
	}
}

// DynamoDBClient is a DynamoDB client for the server at endpoint (dynalite).
func DynamoDBClient(endpoint string) *dynamodb.Client {
	return dynamodb.NewFromConfig(AWSConfig(), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(endpoint) })
}
