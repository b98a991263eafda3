//go:build !goredisscript

package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/redisbatch"
)

// evalOwned runs EVALSHA with args (args[1] the script's SHA1), and EVAL
// when the server does not know the script (NOSCRIPT), as
// goredis.Script.Run does.
func (s *Store) evalOwned(ctx context.Context, script *ownedScript, args []any, p *redisbatch.Pending) (int64, error) {
	cmd := cmds.Get().(*goredis.Cmd)
	*cmd = *goredis.NewCmd(ctx, args...)
	_ = s.process(ctx, cmd, p)
	// (HasErrorPrefix allocates even for a nil error.)
	if err := cmd.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", &script.src
		*cmd = *goredis.NewCmd(ctx, args...)
		_ = s.process(ctx, cmd, p)
	}
	n, err := cmd.Int64()
	*cmd = goredis.Cmd{}
	cmds.Put(cmd)
	return n, err
}
