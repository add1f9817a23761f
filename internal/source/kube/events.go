package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/vipproxy/vipproxy/internal/model"
)

// EventCreator creates core/v1 Events (the API kube-proxy's event recorder
// writes too; its ClusterRole system:node-proxier allows it).
type EventCreator interface {
	Create(ctx context.Context, ev *corev1.Event) error
}

// restEvents creates Events over the core REST client.
type restEvents struct{ c *rest.RESTClient }

func (r restEvents) Create(ctx context.Context, ev *corev1.Event) error {
	return r.c.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
}

// ServiceEvent records an Event on Service svc: type Warning when warning,
// else Normal, from component "vipproxy" on this node. It fails when the
// Client has no Events (a test's fake) or the API server refuses it.
func (s *Source) ServiceEvent(ctx context.Context, svc model.ServiceName, warning bool, reason, message string) error {
	if s.opts.Client == nil || s.opts.Client.Events == nil {
		return errors.New("kube: no event client")
	}
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      svc.Name + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: svc.Namespace,
		},
		InvolvedObject:      corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name},
		Reason:              reason,
		Message:             message,
		Type:                typ,
		Source:              corev1.EventSource{Component: "vipproxy", Host: s.opts.NodeName},
		ReportingController: "vipproxy.io/vipproxy",
		ReportingInstance:   "vipproxy-" + s.opts.NodeName,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	if err := s.opts.Client.Events.Create(ctx, ev); err != nil {
		return fmt.Errorf("kube: event %s on Service %s: %w", reason, svc, err)
	}
	return nil
}
