package config

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	// The json format, registered as kube-proxy registers it (before the
	// logging flags are defined: the registry freezes then).
	_ "k8s.io/component-base/logs/json/register"
)

// loggingFlags are the flags logsapi.AddFlags defines, each mapped onto
// one field of the file's logging section by copyLoggingFlag.
var loggingFlags = []string{
	"logging-format", logsapi.LogFlushFreqFlagName, "v", "vmodule",
	"log-text-split-stream", "log-text-info-buffer-size",
	"log-json-split-stream", "log-json-info-buffer-size",
}

func init() {
	for _, name := range loggingFlags {
		notFromFile[name] = true
	}
}

// copyLoggingFlag sets the field of dst that flag name sets, from src.
func copyLoggingFlag(dst, src *logsapi.LoggingConfiguration, name string) {
	switch name {
	case "logging-format":
		dst.Format = src.Format
	case logsapi.LogFlushFreqFlagName:
		dst.FlushFrequency = src.FlushFrequency
	case "v":
		dst.Verbosity = src.Verbosity
	case "vmodule":
		dst.VModule = slices.Clone(src.VModule)
	case "log-text-split-stream":
		dst.Options.Text.SplitStream = src.Options.Text.SplitStream
	case "log-text-info-buffer-size":
		dst.Options.Text.InfoBufferSize = src.Options.Text.InfoBufferSize
	case "log-json-split-stream":
		dst.Options.JSON.SplitStream = src.Options.JSON.SplitStream
	case "log-json-info-buffer-size":
		dst.Options.JSON.InfoBufferSize = src.Options.JSON.InfoBufferSize
	}
}

// resolveLogging applies the logging flags given on the command line over
// the file's logging section (kube-proxy: "logging command line flags have
// priority"), fills what is still unset with component-base's recommended
// values, and sets LoggingFormat and Verbosity from the result, so that
// --write-config-to shows what runs.
func (c *Config) resolveLogging() {
	l := &c.KubeProxy.Logging
	if o := c.overrides.logging; o != nil {
		for _, name := range c.overrides.loggingFlags {
			copyLoggingFlag(l, o, name)
		}
	}
	logsapi.SetRecommendedLoggingConfiguration(l)
	if l.Format == "" {
		l.Format = DefaultLoggingFormat
	}
	c.LoggingFormat = l.Format
	c.Verbosity = int(l.Verbosity)
}

// LoggingGate is the component-base feature gate logsapi validates and
// applies the logging section against, with LoggingAlphaOptions,
// LoggingBetaOptions and ContextualLogging set as --feature-gates (or
// featureGates in the file) resolve them.
func (c *Config) LoggingGate() featuregate.FeatureGate {
	g := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(g); err != nil {
		panic(fmt.Sprintf("config: logging feature gates: %v", err))
	}
	set := map[string]bool{}
	for _, f := range []featuregate.Feature{logsapi.LoggingAlphaOptions, logsapi.LoggingBetaOptions, logsapi.ContextualLogging} {
		set[string(f)] = featureEnabled(c.KubeProxy.FeatureGates, string(f))
	}
	if err := g.SetFromMap(set); err != nil {
		panic(fmt.Sprintf("config: logging feature gates: %v", err))
	}
	return g
}

// checkLogging validates the logging section as kube-proxy does
// (logsapi.Validate: format registered, options allowed by the gates,
// vmodule, flush frequency), naming the flag when one set the field.
func (c *Config) checkLogging(k *checker) {
	for _, e := range logsapi.Validate(&c.KubeProxy.Logging, c.LoggingGate(), field.NewPath("logging")) {
		name := e.Field
		if flag := loggingFlagFor(e.Field); flag != "" && (c.ConfigFile == "" || slices.Contains(c.overrides.loggingFlags, flag)) {
			name = "--" + flag
			if flag == "v" {
				name = "-v"
			}
		}
		value := loggingValue(&c.KubeProxy.Logging, e.Field)
		if e.BadValue != nil && e.BadValue != "" {
			value = fmt.Sprint(e.BadValue)
		}
		k.fail(name, value, "%s", e.Detail)
	}
}

// loggingValue renders the value of the logging field at path as its
// flag takes it (Forbidden errors carry no value of their own).
func loggingValue(l *logsapi.LoggingConfiguration, path string) string {
	switch path {
	case "logging.format":
		return l.Format
	case "logging.flushFrequency":
		return l.FlushFrequency.Duration.Duration.String()
	case "logging.verbosity":
		return fmt.Sprint(uint32(l.Verbosity))
	case "logging.vmodule":
		return logsapi.VModuleConfigurationPflag(&l.VModule).String()
	case "logging.options.text.splitStream":
		return fmt.Sprint(l.Options.Text.SplitStream)
	case "logging.options.text.infoBufferSize":
		return l.Options.Text.InfoBufferSize.String()
	case "logging.options.json.splitStream":
		return fmt.Sprint(l.Options.JSON.SplitStream)
	case "logging.options.json.infoBufferSize":
		return l.Options.JSON.InfoBufferSize.String()
	}
	return ""
}

// loggingFlagFor maps a logging field path to the flag that sets it.
func loggingFlagFor(path string) string {
	switch path {
	case "logging.format":
		return "logging-format"
	case "logging.flushFrequency":
		return logsapi.LogFlushFreqFlagName
	case "logging.verbosity":
		return "v"
	case "logging.vmodule":
		return "vmodule"
	case "logging.options.text.splitStream":
		return "log-text-split-stream"
	case "logging.options.text.infoBufferSize":
		return "log-text-info-buffer-size"
	case "logging.options.json.splitStream":
		return "log-json-split-stream"
	case "logging.options.json.infoBufferSize":
		return "log-json-info-buffer-size"
	}
	return ""
}
