//go:build goredisscript

package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/redisbatch"
)

// evalOwned runs the script with go-redis' (*Script).Run (EVALSHA, EVAL on
// NOSCRIPT): args are EVALSHA's (args[3] the key, args[4:] the script's
// arguments). With Config.AutoPipeline the commands go through the batcher.
func (s *Store) evalOwned(ctx context.Context, script *ownedScript, args []any, p *redisbatch.Pending) (int64, error) {
	keys := []string{*args[3].(*string)}
	var c goredis.Scripter = s.client
	if s.ap != nil {
		c = s.ap
	} else if s.batch != nil {
		c = batchScripter{s, p}
	}
	return script.script.Run(ctx, c, keys, args[4:]...).Int64()
}

// batchScripter sends a script's commands through the store's batcher.
type batchScripter struct {
	s *Store
	p *redisbatch.Pending
}

func (b batchScripter) do(ctx context.Context, args ...any) *goredis.Cmd {
	cmd := goredis.NewCmd(ctx, args...)
	_ = b.s.batch.Process(ctx, cmd, b.p)
	return cmd
}

func (b batchScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return b.do(ctx, append(append([]any{"eval", script, len(keys)}, strs(keys)...), args...)...)
}

func (b batchScripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return b.do(ctx, append(append([]any{"evalsha", sha1, len(keys)}, strs(keys)...), args...)...)
}

func (b batchScripter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return b.s.client.EvalRO(ctx, script, keys, args...)
}

func (b batchScripter) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return b.s.client.EvalShaRO(ctx, sha1, keys, args...)
}

func (b batchScripter) ScriptExists(ctx context.Context, hashes ...string) *goredis.BoolSliceCmd {
	return b.s.client.ScriptExists(ctx, hashes...)
}

func (b batchScripter) ScriptLoad(ctx context.Context, script string) *goredis.StringCmd {
	return b.s.client.ScriptLoad(ctx, script)
}

func strs(keys []string) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}
