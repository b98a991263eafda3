package docs_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"go.yaml.in/yaml/v3"
)

// samTransform is the transform a template with AWS::Serverless::*
// resources must declare: without it CloudFormation refuses the template.
const samTransform = "AWS::Serverless-2016-10-31"

// templatePages are the guides whose infrastructure blocks (```yaml for
// CloudFormation and SAM, ```hcl for Terraform) TestTemplatesHoldWhatThePagesSay
// checks.
var templatePages = []string{"docs/dynamodb.md", "docs/lambda.md"}

// The guides' CloudFormation, SAM and Terraform blocks hold what the pages
// say. No linter runs here (cfn-lint and terraform are not part of the test
// dependencies), so this is what is checked, and what the pages say is
// checked:
//
//   - each yaml block parses as YAML, has Resources each with a Type, and
//     every !Ref and !GetAtt names one of its resources or parameters (or a
//     pseudo parameter, AWS::…);
//   - a yaml block with an AWS::Serverless::* resource declares
//     Transform: AWS::Serverless-2016-10-31, and each SQS, Kinesis or
//     DynamoDB event of its functions sets FunctionResponseTypes with
//     ReportBatchItemFailures;
//   - each hcl block parses as HCL native syntax (what Terraform reads);
//     every resource and data block has a type and a name, and every
//     reference to one (aws_dynamodb_table.dedup.arn) names a block of the
//     same code block; each aws_lambda_event_source_mapping sets
//     function_response_types to a list holding "ReportBatchItemFailures".
//
// docs/lambda.md must have a SAM template and a Terraform mapping, so the
// checks cannot pass by finding nothing.
func TestTemplatesHoldWhatThePagesSay(t *testing.T) {
	root := repoRoot(t)
	var sam, mappings int
	for _, page := range templatePages {
		m, problems := parseMarkdown(page, readRepoFile(t, root, page))
		for _, p := range problems {
			t.Error(p)
		}
		for _, b := range m.blocks {
			where := m.where(b.line)
			switch b.info {
			case "yaml":
				r := checkCloudFormation(b.code)
				sam += r.samFunctions
				for _, p := range r.problems {
					t.Errorf("%s: %s", where, p)
				}
			case "hcl":
				r := checkTerraform(b.code, where)
				mappings += r.mappings
				for _, p := range r.problems {
					t.Errorf("%s: %s", where, p)
				}
			}
		}
	}
	if sam == 0 || mappings == 0 {
		t.Errorf("found %d SAM functions and %d Terraform event source mappings in %v; docs/lambda.md shows one of each at least", sam, mappings, templatePages)
	}
}

type templateResult struct {
	problems               []string
	samFunctions, mappings int
}

// checkCloudFormation checks a CloudFormation or SAM template in YAML.
func checkCloudFormation(src string) templateResult {
	var r templateResult
	problem := func(format string, args ...any) { r.problems = append(r.problems, fmt.Sprintf(format, args...)) }
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		problem("the template does not parse as YAML: %v", err)
		return r
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		problem("the template is not a YAML mapping")
		return r
	}
	top := doc.Content[0]
	resources := mapValue(top, "Resources")
	if resources == nil || resources.Kind != yaml.MappingNode || len(resources.Content) == 0 {
		problem("the template has no Resources")
		return r
	}
	names := map[string]bool{}
	for _, section := range []string{"Resources", "Parameters"} {
		if n := mapValue(top, section); n != nil && n.Kind == yaml.MappingNode {
			for i := 0; i < len(n.Content); i += 2 {
				names[n.Content[i].Value] = true
			}
		}
	}
	serverless := false
	for i := 0; i < len(resources.Content); i += 2 {
		name, res := resources.Content[i].Value, resources.Content[i+1]
		typ := mapValue(res, "Type")
		if typ == nil || typ.Value == "" {
			problem("resource %s has no Type", name)
			continue
		}
		if strings.HasPrefix(typ.Value, "AWS::Serverless::") {
			serverless = true
		}
		if typ.Value != "AWS::Serverless::Function" {
			continue
		}
		r.samFunctions++
		events := mapValue(mapValue(res, "Properties"), "Events")
		if events == nil {
			continue
		}
		for j := 0; j+1 < len(events.Content); j += 2 {
			event, ev := events.Content[j].Value, events.Content[j+1]
			switch t := mapValue(ev, "Type"); {
			case t == nil:
				problem("event %s of %s has no Type", event, name)
			case t.Value == "SQS" || t.Value == "Kinesis" || t.Value == "DynamoDB":
				if !slices.Contains(scalars(mapValue(mapValue(ev, "Properties"), "FunctionResponseTypes")), "ReportBatchItemFailures") {
					problem("the %s event %s of %s does not set FunctionResponseTypes: [ReportBatchItemFailures]", t.Value, event, name)
				}
			}
		}
	}
	if transform := mapValue(top, "Transform"); serverless && !slices.Contains(scalars(transform), samTransform) {
		problem("the template has AWS::Serverless::* resources but no Transform: %s", samTransform)
	}
	walkYAML(top, func(n *yaml.Node) {
		var target string
		switch n.Tag {
		case "!Ref":
			target = n.Value
		case "!GetAtt":
			target, _, _ = strings.Cut(n.Value, ".")
		default:
			return
		}
		if !names[target] && !strings.HasPrefix(target, "AWS::") {
			problem("line %d: %s %s names no resource or parameter of the template", n.Line, n.Tag, n.Value)
		}
	})
	return r
}

// mapValue returns the value of key in the mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// scalars returns a scalar's value, or a sequence's scalar values.
func scalars(n *yaml.Node) []string {
	switch {
	case n == nil:
		return nil
	case n.Kind == yaml.ScalarNode:
		return []string{n.Value}
	}
	var out []string
	for _, c := range n.Content {
		if c.Kind == yaml.ScalarNode {
			out = append(out, c.Value)
		}
	}
	return out
}

func walkYAML(n *yaml.Node, visit func(*yaml.Node)) {
	visit(n)
	for _, c := range n.Content {
		walkYAML(c, visit)
	}
}

// checkTerraform checks a Terraform configuration in HCL native syntax.
func checkTerraform(src, where string) templateResult {
	var r templateResult
	problem := func(format string, args ...any) { r.problems = append(r.problems, fmt.Sprintf(format, args...)) }
	f, diags := hclparse.NewParser().ParseHCL([]byte(src), where)
	if diags.HasErrors() {
		problem("the block does not parse as HCL: %v", diags)
		return r
	}
	body := f.Body.(*hclsyntax.Body)
	declared := map[string]bool{} // "aws_dynamodb_table.dedup", "data.aws_iam_policy_document.x"
	for _, b := range body.Blocks {
		switch b.Type {
		case "resource", "data":
			if len(b.Labels) != 2 {
				problem("line %d: a %s block has %d labels, want a type and a name", b.DefRange().Start.Line, b.Type, len(b.Labels))
				continue
			}
			ref := b.Labels[0] + "." + b.Labels[1]
			if b.Type == "data" {
				ref = "data." + ref
			}
			declared[ref] = true
		}
	}
	for _, b := range body.Blocks {
		if b.Type == "resource" && len(b.Labels) == 2 && b.Labels[0] == "aws_lambda_event_source_mapping" {
			r.mappings++
			if !listHolds(b.Body.Attributes["function_response_types"], "ReportBatchItemFailures") {
				problem("line %d: aws_lambda_event_source_mapping.%s does not set function_response_types = [\"ReportBatchItemFailures\"]", b.DefRange().Start.Line, b.Labels[1])
			}
		}
		_ = hclsyntax.VisitAll(b.Body, func(n hclsyntax.Node) hcl.Diagnostics {
			e, ok := n.(hclsyntax.Expression)
			if !ok {
				return nil
			}
			for _, tr := range e.Variables() {
				root := tr.RootName()
				if root == "var" || root == "local" || root == "each" || root == "count" || root == "path" || root == "module" || root == "self" {
					continue // inputs, locals and the like are the reader's to declare
				}
				ref := root
				for _, step := range tr[1:] {
					a, ok := step.(hcl.TraverseAttr)
					if !ok {
						break
					}
					ref += "." + a.Name
					if root != "data" || strings.Count(ref, ".") == 2 {
						break
					}
				}
				if !declared[ref] {
					problem("line %d: %s names no resource or data block of the code block", tr.SourceRange().Start.Line, ref)
				}
			}
			return nil
		})
	}
	return r
}

// listHolds reports whether attr is a list of literal strings holding want.
func listHolds(attr *hclsyntax.Attribute, want string) bool {
	if attr == nil {
		return false
	}
	v, diags := attr.Expr.Value(nil)
	if diags.HasErrors() || v.IsNull() || !v.Type().IsTupleType() && !v.Type().IsListType() {
		return false
	}
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		if e.Type().FriendlyName() == "string" && e.AsString() == want {
			return true
		}
	}
	return false
}

// The template checker fails on a SAM template without the transform, an
// SQS event without ReportBatchItemFailures, a !GetAtt to no resource and
// a YAML syntax error, and on a Terraform mapping without
// function_response_types, a reference to no resource and an HCL syntax
// error; the pages' own kind of blocks pass.
func TestTemplateCheckerFails(t *testing.T) {
	const good = `Transform: AWS::Serverless-2016-10-31
Resources:
  Q:
    Type: AWS::SQS::Queue
  F:
    Type: AWS::Serverless::Function
    Properties:
      Environment:
        Variables:
          REGION: !Ref AWS::Region
      Events:
        E:
          Type: SQS
          Properties:
            Queue: !GetAtt Q.Arn
            FunctionResponseTypes: [ReportBatchItemFailures]
`
	if r := checkCloudFormation(good); len(r.problems) > 0 || r.samFunctions != 1 {
		t.Errorf("a good SAM template: %+v", r)
	}
	bad := strings.NewReplacer("Transform: AWS::Serverless-2016-10-31\n", "",
		"FunctionResponseTypes: [ReportBatchItemFailures]", "BatchSize: 10",
		"!GetAtt Q.Arn", "!GetAtt Queue.Arn").Replace(good)
	got := strings.Join(checkCloudFormation(bad).problems, "\n")
	for _, want := range []string{"no Transform: AWS::Serverless-2016-10-31", "the SQS event E of F does not set FunctionResponseTypes", "!GetAtt Queue.Arn names no resource"} {
		if !strings.Contains(got, want) {
			t.Errorf("the YAML checker did not report %q; it reported:\n%s", want, got)
		}
	}
	if got := checkCloudFormation("Resources:\n  Q: [\n"); len(got.problems) != 1 || !strings.Contains(got.problems[0], "does not parse as YAML") {
		t.Errorf("broken YAML: %v", got.problems)
	}

	const goodHCL = `resource "aws_sqs_queue" "q" {}

resource "aws_lambda_event_source_mapping" "m" {
  event_source_arn        = aws_sqs_queue.q.arn
  function_name           = var.function_name
  function_response_types = ["ReportBatchItemFailures"]
}

data "aws_iam_policy_document" "p" {
  statement {
    resources = [aws_sqs_queue.q.arn]
  }
}

output "p" {
  value = data.aws_iam_policy_document.p.json
}
`
	if r := checkTerraform(goodHCL, "good.tf"); len(r.problems) > 0 || r.mappings != 1 {
		t.Errorf("a good Terraform block: %+v", r)
	}
	badHCL := strings.NewReplacer(`function_response_types = ["ReportBatchItemFailures"]`, `batch_size = 10`,
		"aws_sqs_queue.q.arn\n  function_name", "aws_sqs_queue.orders.arn\n  function_name").Replace(goodHCL)
	got = strings.Join(checkTerraform(badHCL, "bad.tf").problems, "\n")
	for _, want := range []string{`aws_lambda_event_source_mapping.m does not set function_response_types`, "aws_sqs_queue.orders names no resource"} {
		if !strings.Contains(got, want) {
			t.Errorf("the HCL checker did not report %q; it reported:\n%s", want, got)
		}
	}
	if got := checkTerraform("resource \"a\" \"b\" {\n  x = [\n}\n", "broken.tf"); len(got.problems) != 1 || !strings.Contains(got.problems[0], "does not parse as HCL") {
		t.Errorf("broken HCL: %v", got.problems)
	}
}
