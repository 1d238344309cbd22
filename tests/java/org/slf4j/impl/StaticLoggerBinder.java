package org.slf4j.impl;

import java.io.PrintStream;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;

import org.slf4j.ILoggerFactory;
import org.slf4j.Logger;
import org.slf4j.helpers.FormattingTuple;
import org.slf4j.helpers.MarkerIgnoringBase;
import org.slf4j.helpers.MessageFormatter;
import org.slf4j.spi.LoggerFactoryBinder;

/**
 * A minimal SLF4J 1.7 binding (the jar set we run against has slf4j-api but no backend): it prints the Kafka
 * client's log lines to stderr at or above the level in the system property {@code kcompat.log}
 * (TRACE, DEBUG, INFO, WARN, ERROR, OFF; default WARN), so that a failing scenario shows what the client saw;
 * {@code kcompat.log.<logger name>} overrides it for one logger.
 */
public final class StaticLoggerBinder implements LoggerFactoryBinder {
    public static String REQUESTED_API_VERSION = "1.6.99";

    private static final StaticLoggerBinder SINGLETON = new StaticLoggerBinder();
    private final ILoggerFactory factory = new StderrLoggerFactory();

    public static StaticLoggerBinder getSingleton() {
        return SINGLETON;
    }

    @Override
    public ILoggerFactory getLoggerFactory() {
        return factory;
    }

    @Override
    public String getLoggerFactoryClassStr() {
        return StderrLoggerFactory.class.getName();
    }

    static final class StderrLoggerFactory implements ILoggerFactory {
        private final ConcurrentMap<String, Logger> loggers = new ConcurrentHashMap<>();
        private final String level = System.getProperty("kcompat.log", "WARN");

        @Override
        public Logger getLogger(String name) {
            // kcompat.log.<logger name> sets one logger's level, for a test that reads what that class says.
            return loggers.computeIfAbsent(name,
                    n -> new StderrLogger(n, levelOf(System.getProperty("kcompat.log." + n, level))));
        }
    }

    static int levelOf(String s) {
        switch (s.trim().toUpperCase()) {
            case "TRACE": return 0;
            case "DEBUG": return 1;
            case "INFO": return 2;
            case "WARN": return 3;
            case "ERROR": return 4;
            default: return 5;
        }
    }

    static final class StderrLogger extends MarkerIgnoringBase {
        private static final long serialVersionUID = 1L;
        private static final String[] NAMES = {"TRACE", "DEBUG", "INFO", "WARN", "ERROR"};
        private final int threshold;

        StderrLogger(String name, int threshold) {
            this.name = name;
            this.threshold = threshold;
        }

        private boolean on(int level) {
            return level >= threshold;
        }

        private void log(int level, String msg, Throwable t) {
            if (!on(level)) return;
            PrintStream err = System.err;
            synchronized (err) {
                err.printf("[%tT.%<tL] %s [%s] %s: %s%n", System.currentTimeMillis(), NAMES[level],
                        Thread.currentThread().getName(), name, msg);
                if (t != null) t.printStackTrace(err);
            }
        }

        private void fmt(int level, FormattingTuple ft) {
            log(level, ft.getMessage(), ft.getThrowable());
        }

        private void logf(int level, String format, Object... args) {
            if (on(level)) fmt(level, MessageFormatter.arrayFormat(format, args));
        }

        @Override public boolean isTraceEnabled() { return on(0); }
        @Override public void trace(String msg) { log(0, msg, null); }
        @Override public void trace(String f, Object a) { logf(0, f, a); }
        @Override public void trace(String f, Object a, Object b) { logf(0, f, a, b); }
        @Override public void trace(String f, Object... a) { logf(0, f, a); }
        @Override public void trace(String msg, Throwable t) { log(0, msg, t); }

        @Override public boolean isDebugEnabled() { return on(1); }
        @Override public void debug(String msg) { log(1, msg, null); }
        @Override public void debug(String f, Object a) { logf(1, f, a); }
        @Override public void debug(String f, Object a, Object b) { logf(1, f, a, b); }
        @Override public void debug(String f, Object... a) { logf(1, f, a); }
        @Override public void debug(String msg, Throwable t) { log(1, msg, t); }

        @Override public boolean isInfoEnabled() { return on(2); }
        @Override public void info(String msg) { log(2, msg, null); }
        @Override public void info(String f, Object a) { logf(2, f, a); }
        @Override public void info(String f, Object a, Object b) { logf(2, f, a, b); }
        @Override public void info(String f, Object... a) { logf(2, f, a); }
        @Override public void info(String msg, Throwable t) { log(2, msg, t); }

        @Override public boolean isWarnEnabled() { return on(3); }
        @Override public void warn(String msg) { log(3, msg, null); }
        @Override public void warn(String f, Object a) { logf(3, f, a); }
        @Override public void warn(String f, Object a, Object b) { logf(3, f, a, b); }
        @Override public void warn(String f, Object... a) { logf(3, f, a); }
        @Override public void warn(String msg, Throwable t) { log(3, msg, t); }

        @Override public boolean isErrorEnabled() { return on(4); }
        @Override public void error(String msg) { log(4, msg, null); }
        @Override public void error(String f, Object a) { logf(4, f, a); }
        @Override public void error(String f, Object a, Object b) { logf(4, f, a, b); }
        @Override public void error(String f, Object... a) { logf(4, f, a); }
        @Override public void error(String msg, Throwable t) { log(4, msg, t); }
    }
}
